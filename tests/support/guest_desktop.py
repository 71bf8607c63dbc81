"""The debian guest's desktop, drawn on this host: Xvfb at the guest's 1280x800, and the guest
recipe's own session files (vmd/images/debian/rootfs/home/agent: `.xinitrc` sets the desktop's
colour and starts openbox, which starts the terminal as `.vmagent-terminal` says: xterm, font
9x15, 110x36 at +30+30) run from a home folder of their own. The same Debian packages draw it
(openbox, xterm, xfonts-base, python3-tk; scripts/setup.sh installs them), so the pixels are
the guest's, the prompt included: `agent@vmagent-guest:~$ `, what the guest's skeleton
`.bashrc` prints for user agent on host vmagent-guest.

The scenes know every word they put on the screen, from what they typed, printed or wrote
into a window, never from OCR: the ground truth of tests/vmd/machines/test_screen_read_whole.py and
bench/ocr.py. A screenshot comes through vmd's own Screen (vmd/machines/screen.py) from the
framebuffer Xvfb keeps in a file (-fbdir, X's XWD format), as a guest's comes from QEMU's dump.
"""

from __future__ import annotations

import os
import select
import shutil
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from vmd.machines.screen import Screen, Shot

ROOT = Path(__file__).resolve().parents[2]
GUEST_HOME = ROOT / "vmd" / "images" / "debian" / "rootfs" / "home" / "agent"
SIZE = (1280, 800)
PROMPT = "agent@vmagent-guest:~$"
# Debian's python3 with Tk, as in the guest (not whatever python3 comes first on PATH).
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
TK_PYTHON = "/usr/bin/python3"
PROGRAMS = ("Xvfb", "openbox", "xterm", "xsetroot", "xdotool")


def missing() -> str:
    """What this host lacks to draw the guest's desktop, as the command that installs it; ''
    when nothing is missing."""
    lacking = [p for p in PROGRAMS if shutil.which(p, path=SYSTEM_PATH) is None]
    if not Path("/usr/share/fonts/X11/misc/9x15.pcf.gz").exists():
        lacking.append("the 9x15 font")
    if subprocess.run([TK_PYTHON, "-c", "import tkinter"], capture_output=True).returncode != 0:
        lacking.append("python3 with Tk")
    if not lacking:
        return ""
    return (f"the guest's desktop cannot be drawn here without {', '.join(lacking)}: apt-get install "
            "xvfb openbox xterm xfonts-base x11-xserver-utils xdotool python3-tk (scripts/setup.sh does)")


@dataclass
class Scene:
    """A desktop as drawn: its name and the words on it, in reading order."""
    name: str
    words: list[str] = field(default_factory=list)

    def add(self, text: str) -> None:
        # A word has a letter or a digit, as in vmd's reading: lone signs (`#`, `=`, `&`)
        # are not words there, nor here.
        self.words += [w for w in text.split() if any(c.isalnum() for c in w)]


class GuestDesktop:
    """Xvfb with the guest's session on it. Use as a context manager; it leaves nothing
    running and removes its folder."""

    def __init__(self, size: tuple[int, int] = SIZE):
        self.size = size
        self.folder = Path(tempfile.mkdtemp(prefix="guest-desktop-"))
        self.home = self.folder / "home"
        self.started: list[subprocess.Popen] = []
        self.display = ""

    # --- the session ---------------------------------------------------------------------

    def __enter__(self) -> GuestDesktop:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        shutil.copytree(GUEST_HOME, self.home, symlinks=True)
        # The guest's skeleton .bashrc prompts `\u@\h:\w\$ ` as agent on vmagent-guest; this
        # host's user and name differ, so the login shell is told the guest's words. It also
        # colours ls (bold blue folders). (.bashrc for the shells of xterms the scenes open,
        # .profile for the login shell.)
        (self.home / ".bashrc").write_text("PS1='agent@vmagent-guest:\\w$ '\nalias ls='ls --color=auto'\n")
        (self.home / ".profile").write_text(". \"$HOME/.bashrc\"\n")
        (self.folder / "fb").mkdir()
        read, write = os.pipe()
        # -displayfd: the server picks a free display and says which; -fbdir: it keeps the
        # framebuffer in a file there (XWD), read for screenshots; -noreset: a server that
        # resets when its last client leaves refused the next one now and then ("Can't open
        # display") and dropped the desktop's colour.
        self._spawn(["Xvfb", "-displayfd", str(write), "-screen", "0", f"{self.size[0]}x{self.size[1]}x24",
                     "-fbdir", str(self.folder / "fb"), "-nolisten", "tcp", "-noreset"],
                    pass_fds=(write,))
        os.close(write)
        try:
            self.display = ":" + self._read_line(read, 20).strip()
        finally:
            os.close(read)
        self._wait_for_server()
        self._spawn(["sh", str(self.home / ".xinitrc")], cwd=self.home)
        self.wait_for_window("terminal")
        # Xvfb draws the pointer into its framebuffer (a guest's hardware cursor is not in
        # QEMU's dump): out of the way, on the bare desktop.
        self.xdotool("mousemove", str(self.size[0] - 4), str(self.size[1] - 4))
        self.settle()

    def _read_line(self, fd: int, timeout: float) -> str:
        got = b""
        deadline = time.monotonic() + timeout
        while not got.endswith(b"\n"):
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise RuntimeError(f"Xvfb did not start within {timeout:g} s")
            chunk = os.read(fd, 64)
            if not chunk:
                raise RuntimeError("Xvfb exited before it named its display")
            got += chunk
        return got.decode()

    def _wait_for_server(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            done = subprocess.run(["xdotool", "getdisplaygeometry"], env=self.env(), capture_output=True,
                                  text=True, timeout=30)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                log = (self.folder / "Xvfb.log").read_text(errors="replace")[-600:]
                raise RuntimeError(f"Xvfb on {self.display} took no connection in {timeout:g} s: "
                                   f"{done.stderr.strip()}; its log: {log}")
            time.sleep(0.2)

    def env(self) -> dict[str, str]:
        return {"PATH": SYSTEM_PATH, "HOME": str(self.home), "DISPLAY": self.display,
                "USER": "agent", "SHELL": "/bin/bash", "TERM": "xterm"}

    def _spawn(self, argv: list[str], **kwargs) -> subprocess.Popen:
        with open(self.folder / f"{Path(argv[0]).name}.log", "ab") as log:
            process = subprocess.Popen(argv, env=self.env() if self.display else {"PATH": SYSTEM_PATH},
                                       stdout=log, stderr=log, start_new_session=True, **kwargs)
        self.started.append(process)
        return process

    def close(self) -> None:
        for process in reversed(self.started):  # the session's programs first, Xvfb last
            if process.poll() is None:
                try:
                    os.killpg(process.pid, 15)
                except ProcessLookupError:
                    pass
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, 9)
                    process.wait(10)
        self.started.clear()
        shutil.rmtree(self.folder, ignore_errors=True)

    # --- drawing -------------------------------------------------------------------------

    def xdotool(self, *args: str) -> str:
        done = subprocess.run(["xdotool", *args], env=self.env(), capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"xdotool {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def wait_for_window(self, title: str) -> None:
        self.xdotool("search", "--sync", "--onlyvisible", "--name", f"^{title}$")

    def type(self, text: str) -> None:
        """Keys typed into the focused window, as a person (or vmd's `type`) does."""
        self.xdotool("type", "--delay", "2", text)
        self.settle()

    def open_tk(self, name: str, program: str, title: str) -> None:
        """A Tk program (Debian's python3, as the guest has) whose window is titled `title`."""
        path = self.folder / f"{name}.py"
        path.write_text(program)
        self._spawn([TK_PYTHON, str(path)], cwd=self.home)
        self.wait_for_window(title)
        self.settle()

    def settle(self, quiet_s: float = 0.4, timeout: float = 15.0) -> None:
        """Wait until the screen has not changed for `quiet_s` (xterm's cursor does not blink)."""
        deadline = time.monotonic() + timeout
        last, since = self._framebuffer(), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = self._framebuffer()
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                return
        raise RuntimeError(f"the screen kept changing for {timeout:g} s")

    # --- the screen ----------------------------------------------------------------------

    def _framebuffer(self) -> bytes:
        return (self.folder / "fb" / "Xvfb_screen0").read_bytes()

    def image(self) -> Image.Image:
        """The framebuffer as a picture: the XWD header (25 big-endian words, then the name
        and the colour map), then 32-bit pixels, blue first."""
        data = self._framebuffer()
        header = struct.unpack(">25I", data[:100])
        header_size, width, height, bytes_per_line, colours = header[0], header[4], header[5], header[12], header[19]
        if header[11] != 32 or header[7] != 0:  # bits per pixel, byte order (LSBFirst)
            raise RuntimeError(f"Xvfb's framebuffer is not 32-bit LSB-first ({header[11]} bits, order {header[7]})")
        start = header_size + colours * 12
        return Image.frombuffer("RGB", (width, height), data[start:start + bytes_per_line * height], "raw",
                                "BGRX", bytes_per_line, 1).copy()

    def screenshot(self) -> Shot:
        """The screen as vmd shows it to the agent: vmd's Screen encodes the frame (a PPM, as
        QEMU's dump is) into the PNG that the screen text is read from."""
        screen = Screen(domain=None, size=self.size)
        frame = self.image()
        screen.grab_raw = lambda: _ppm(frame)
        return screen.screenshot()


def _ppm(image: Image.Image) -> bytes:
    import io

    buf = io.BytesIO()
    image.save(buf, format="PPM")
    return buf.getvalue()


# --- the scenes --------------------------------------------------------------------------
# Each draws on a fresh desktop and returns the words drawn. Window titles count: openbox
# draws them on the screen too.

NOTES = ["build 42 passed: 17 tests in 3.2s", "warning: config.yaml not found, using defaults",
         "next step: run make install"]


def idle_terminal(desktop: GuestDesktop) -> Scene:
    """The guest as it boots: the terminal, focused, waiting at its prompt."""
    scene = Scene("idle xterm")
    scene.add("terminal")
    scene.add(PROMPT)
    return scene


def terminal_with_output(desktop: GuestDesktop) -> Scene:
    """Three commands typed at the prompt and what they printed, and the prompt again."""
    (desktop.home / "notes.txt").write_text("\n".join(NOTES) + "\n")
    desktop.type("cat notes.txt\n")
    desktop.type("mkdir reports; ls\n")
    desktop.type("ls -l missing.txt\n")
    scene = Scene("xterm with output")
    scene.add("terminal")
    scene.add(f"{PROMPT} cat notes.txt")
    for line in NOTES:
        scene.add(line)
    scene.add(f"{PROMPT} mkdir reports; ls")
    scene.add("notes.txt reports")  # the folder in bold blue
    scene.add(f"{PROMPT} ls -l missing.txt")
    scene.add("ls: cannot access 'missing.txt': No such file or directory")
    scene.add(PROMPT)
    return scene


def dark_terminal(desktop: GuestDesktop) -> Scene:
    """A second xterm in reverse video (light on dark), as `xterm -rv` opens it, with output,
    over the first."""
    desktop.type("(xterm -rv -fn 9x15 -geometry 80x12+250+400 -title build &)\n")
    desktop.wait_for_window("build")
    desktop.settle()
    desktop.type("echo compiling module parser; echo done in 4 seconds\n")
    scene = Scene("dark xterm")
    scene.add("terminal")
    scene.add(f"{PROMPT} (xterm -rv -fn 9x15 -geometry 80x12+250+400 -title build &)")
    scene.add(PROMPT)
    scene.add("build")
    scene.add(f"{PROMPT} echo compiling module parser; echo done in 4 seconds")
    scene.add("compiling module parser")
    scene.add("done in 4 seconds")
    scene.add(PROMPT)
    return scene


EDITOR_LINES = [
    "def total(prices, tax=0.2):",
    "    # sum the prices and add the tax",
    "    subtotal = sum(prices)",
    "    return round(subtotal * (1 + tax), 2)",
    "",
    "print(total([3.5, 4.25, 10]))",
]
EDITOR = """import tkinter as tk

LINES = {lines!r}
root = tk.Tk()
root.title("report.py - Editor")
root.geometry("640x420+360+140")
bar = tk.Menu(root)
for name in ("File", "Edit", "Search", "Help"):
    bar.add_cascade(label=name, menu=tk.Menu(bar, tearoff=0))
root.config(menu=bar)
status = tk.Label(root, text="Line 6, Column 1    Python", anchor="w", relief="sunken")
status.pack(side="bottom", fill="x")
text = tk.Text(root, font=("DejaVu Sans Mono", 10))
text.insert("1.0", "\\n".join(LINES))
text.pack(fill="both", expand=True)
root.mainloop()
"""


def editor(desktop: GuestDesktop) -> Scene:
    """A small Tk editor (python3-tk, as the guest has) with a file of code open in it, over
    the idle terminal; its window hides none of the terminal's text."""
    desktop.open_tk("editor", EDITOR.format(lines=EDITOR_LINES), "report.py - Editor")
    scene = Scene("editor")
    scene.add("terminal")
    scene.add(PROMPT)
    scene.add("report.py - Editor")
    scene.add("File Edit Search Help")
    for line in EDITOR_LINES:
        scene.add(line)
    scene.add("Line 6, Column 1 Python")
    return scene


DIALOG = """import tkinter as tk

root = tk.Tk()
root.title("Approval needed")
root.geometry("+430+300")
tk.Label(root, text="Delete 3 old log files from the project?", font=("DejaVu Sans", 10)).pack(padx=24, pady=(18, 4))
tk.Label(root, text="They are kept in the trash for 30 days.", font=("DejaVu Sans", 9)).pack(padx=24, pady=(0, 12))
row = tk.Frame(root)
row.pack(pady=(0, 16))
tk.Button(row, text="Approve", font=("DejaVu Sans", 12)).pack(side="left", padx=8)
tk.Button(row, text="Cancel", font=("DejaVu Sans", 12)).pack(side="left", padx=8)
root.mainloop()
"""


def dialog(desktop: GuestDesktop) -> Scene:
    """A Tk question with two buttons over the idle terminal."""
    desktop.open_tk("dialog", DIALOG, "Approval needed")
    scene = Scene("dialog")
    scene.add("terminal")
    scene.add(PROMPT)
    scene.add("Approval needed")
    scene.add("Delete 3 old log files from the project?")
    scene.add("They are kept in the trash for 30 days.")
    scene.add("Approve Cancel")
    return scene


APPROVAL = """import tkinter as tk

root = tk.Tk()
root.title("Approval needed")
tk.Label(root, text="Please review the change", font=("DejaVu Sans", 12)).pack(padx=30, pady=12)
tk.Button(root, text="Approve", font=("DejaVu Sans", 12)).pack(padx=30, pady=12)
root.mainloop()
"""


def approval(desktop: GuestDesktop) -> Scene:
    """The window tests/e2e/test_ocr_vm.py has a text-only model click on a real guest, where
    openbox places it (below the terminal)."""
    desktop.open_tk("approval", APPROVAL, "Approval needed")
    scene = Scene("approval")
    scene.add("terminal")
    scene.add(PROMPT)
    scene.add("Approval needed")
    scene.add("Please review the change")
    scene.add("Approve")
    return scene


SCENES = (idle_terminal, terminal_with_output, dark_terminal, editor, dialog, approval)


def draw(scene) -> tuple[Scene, Shot]:
    """A fresh desktop with the scene drawn on it: the words drawn and the screenshot."""
    with GuestDesktop() as desktop:
        drawn = scene(desktop)
        return drawn, desktop.screenshot()


def recall(drawn: list[str], read: list[str]) -> tuple[float, list[str]]:
    """The share of the words drawn that were read, each read word matching one drawn word
    (case and punctuation count, but for typographic quotes, which tesseract writes for
    straight ones), and the drawn words not read."""
    left = [_plain(w) for w in read]
    missed = []
    for word in drawn:
        if _plain(word) in left:
            left.remove(_plain(word))
        else:
            missed.append(word)
    return (1.0 - len(missed) / len(drawn)) if drawn else 1.0, missed


def _plain(word: str) -> str:
    return word.translate(str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'}))
