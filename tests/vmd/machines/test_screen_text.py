"""The screen read as text (vmd/machines/screen_text.py): words OCR finds on a screenshot rendered
here, with points that land on them in the agent's coordinates (a scaled-down screen
included), the guest's windows, the caps, what an unreadable PNG or a host without
tesseract gives, and the path from vmagent's `call(..., sees_images=False)` to vmd and back."""

from __future__ import annotations

import base64
import io
import os
import shutil
import struct
import zlib

import pytest
from PIL import Image, ImageDraw, ImageFont

from tests.support.loop_harness import running_vmd
from tests.vmd.guests.linux.test_screen_numbers import X11Guest, parse_windows
from tests.support.vmd_fakes import LocalGuest, LocalScreen
from vmagent import tools
from vmagent.link import Vmd, typed_result
from vmd.guests.guest import CommandResult, GuestError
from vmd.guests.linux.x11_windows import WINDOWS_COMMAND
from vmd.machines import screen_text as st
from vmd.machines.screen import Screen, Shot

# name -> (left, top, dark background), at 1280x800 like the guest's desktop
WORDS = {
    "Approve": (170, 340, False),
    "Cancel": (400, 340, False),
    "Settings": (800, 130, False),
    "Connected": (800, 535, True),
}
POINTS = 24  # a large, clear font: what is tested is the way to the click, not tesseract


@pytest.fixture
def tesseract():
    if shutil.which(st.TESSERACT) is None:
        message = "tesseract is not installed; run `apt-get install tesseract-ocr tesseract-ocr-eng`"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)  # Pillow's own scalable font: no system fonts needed


def render(size=(1280, 800), words=WORDS, factor: float = 1.0) -> tuple[Image.Image, dict]:
    """A desktop-like picture: a dialog with a title bar, a line of text and two buttons, a
    white window, and a white word on a dark bar, on a dark desktop. Returns it and each
    word's drawn box."""
    image = Image.new("RGB", size, (46, 52, 64))
    draw = ImageDraw.Draw(image)

    def at(*values: float) -> list[int]:
        return [int(v * factor) for v in values]

    letters = font(int(POINTS * factor))
    draw.rectangle(at(120, 116, 620, 140), fill=(100, 140, 200))
    draw.text(at(140, 118), "Confirm", font=font(int(POINTS * 0.8 * factor)), fill=(255, 255, 255))
    draw.rectangle(at(120, 140, 620, 440), fill=(217, 217, 217))
    draw.text(at(150, 180), "Apply the new settings?", font=letters, fill=(0, 0, 0))
    draw.rectangle(at(760, 90, 1180, 330), fill=(255, 255, 255))
    draw.rectangle(at(760, 520, 1180, 580), fill=(32, 48, 64))
    boxes = {}
    for word, (left, top, dark) in words.items():
        box = draw.textbbox(at(left, top), word, font=letters)
        if not dark and top > 300:  # a button
            pad = int(14 * factor)
            draw.rectangle([box[0] - pad, box[1] - pad, box[2] + pad, box[3] + pad], fill=(236, 236, 236),
                           outline=(120, 120, 120))
        draw.text(at(left, top), word, font=letters, fill=(255, 255, 255) if dark else (0, 0, 0))
        boxes[word] = box
    return image, boxes


def png_of(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def inside(point, box) -> bool:
    return box[0] <= point[0] <= box[2] and box[1] <= point[1] <= box[3]


def found(words: list[st.Word], text: str) -> st.Word:
    matches = [w for w in words if w.text == text]
    assert matches, f"{text!r} not read; OCR read {[w.text for w in words]}"
    return matches[0]


# --- OCR ----------------------------------------------------------------------------------


def test_the_words_on_screen_are_read_with_points_inside_them(tesseract):
    image, boxes = render()
    words = st.read_words(png_of(image))
    for text, box in boxes.items():  # light text on dark too
        assert inside(found(words, text).centre, box), (text, found(words, text), box)


def ppm_of(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PPM")
    return buf.getvalue()


def test_a_word_point_on_a_scaled_down_screen_clicks_the_word_on_the_framebuffer(tesseract):
    # A 2560x1600 framebuffer shown to the agent at 1280x800, as vmd/machines/screen.py does.
    framebuffer, boxes = render((2560, 1600), factor=2.0)
    screen = Screen(domain=None, size=(1280, 800))
    screen.grab_raw = lambda: ppm_of(framebuffer)  # what libvirt hands over for QEMU
    shot = screen.screenshot()
    assert (shot.width, shot.height, shot.scale) == (1280, 800, 0.5)
    words = st.read_words(shot.png)
    for text, box in boxes.items():
        x, y = found(words, text).centre  # what the model sends to click
        ax, ay = screen._abs(x, y)  # where vmd's click goes on the tablet's axis
        on_framebuffer = (ax * 2559 / 32767, ay * 1599 / 32767)
        assert inside(on_framebuffer, box), (text, (x, y), on_framebuffer, box)


def test_words_are_grouped_into_items_and_listed_with_their_points(tesseract):
    image, boxes = render(words={"Save": (800, 130, False)})
    ImageDraw.Draw(image).text((150, 250), "File Edit View", font=font(POINTS), fill=(0, 0, 0))
    listing = st.describe(1280, 800, st.read_words(png_of(image)), [])
    assert '"File Edit View" at (' in listing and "; words at File (" in listing
    point = listing.split('"Save" at (')[1].split(")")[0]
    assert inside(tuple(int(v) for v in point.split(", ")), boxes["Save"])


def test_a_blank_screen_reads_as_no_text(tesseract):
    blank = png_of(Image.new("RGB", (640, 400), (46, 52, 64)))
    assert st.read_words(blank) == []
    assert "none found" in st.describe(640, 400, [], [])


def test_without_tesseract_the_listing_says_to_install_it(monkeypatch):
    image, _ = render()
    monkeypatch.setattr(st, "TESSERACT", "tesseract-not-installed-here")
    with pytest.raises(st.ScreenTextError, match=r"apt-get install tesseract-ocr tesseract-ocr-eng"):
        st.read_words(png_of(image))
    listing = st.read_screen(png_of(image), 1280, 800, 1.0, X11Guest(LISTING))
    assert "Text on screen: tesseract is not installed on the vmd host" in listing
    assert 'Window "terminal" at (31, 50)' in listing  # the windows are still given


def _png_claiming(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00" * 16))
            + chunk(b"IEND", b""))


@pytest.mark.parametrize("png, words", [
    (b"", "empty"),
    (b"\x89PNG\r\n\x1a\n" + b"\x00garbage" * 100, "could not be decoded"),
    (b"GIF89a" + b"\x00" * 100, "could not be decoded"),
    (_png_claiming(5000, 5000), "5000x5000 pixels, more pixels than a screen has"),
    (_png_claiming(100_000, 100_000), "more pixels than a screen has"),
    (_png_claiming(1280, 800), "could not be decoded"),  # a header and no pixels
    (b"\x89PNG\r\n\x1a\n" + b"\x00" * (st.MAX_PNG_BYTES + 1), "more than"),
])
def test_an_unreadable_png_gives_a_sentence_not_a_crash(png, words):
    with pytest.raises(st.ScreenTextError, match=words) as err:
        st.read_words(png)
    assert str(err.value).endswith("take another.")
    listing = st.read_screen(png, 1280, 800, 1.0, X11Guest(LISTING))
    assert "Text on screen: the screenshot" in listing and 'Window "Approval needed ' in listing


def test_a_timeout_is_a_sentence(tesseract):
    image, _ = render()
    with pytest.raises(st.ScreenTextError, match="longer than 0.001 s"):
        st.read_words(png_of(image), timeout=0.001)


# --- windows ------------------------------------------------------------------------------

# WINDOWS_COMMAND's output (vmd/guests/linux/x11_windows.py) on the debian guest (openbox), bottom of the stack first.
LISTING = """@@active 8388622
@@window 6291468
  Absolute upper-left X:  31
  Absolute upper-left Y:  50
  Width: 994
  Height: 544
  Map State: IsViewable
Frame: 1, 1, 20, 5
Name: terminal
@@window 7340034
  Absolute upper-left X:  10
  Absolute upper-left Y:  10
  Width: 300
  Height: 200
  Map State: IsUnMapped
Frame:
Name: hidden
@@window 8388622
  Absolute upper-left X:  534
  Absolute upper-left Y:  661
  Width: 212
  Height: 92
  Map State: IsViewable
Frame: 1, 1, 20, 5
Name: Approval needed\x1b[31m "quoted"
"""


def test_windows_are_listed_front_first_in_screenshot_pixels():
    windows = parse_windows(LISTING, 0.5, (640, 400))
    assert [w.title for w in windows] == ['Approval needed [31m "quoted"', "terminal"]
    front = windows[0]
    assert (front.x, front.y, front.width, front.height, front.active) == (267, 330, 106, 46, True)
    assert front.frame == (0, 0, 10, 2)  # the title bar, scaled too
    assert front.holds((300, 322)) and not front.holds((300, 300))
    assert not windows[1].active


def test_the_text_is_listed_under_the_window_it_is_on_front_first():
    words = [st.Word("Approve", 600, 720, 60, 14, 96.0), st.Word("Approval", 590, 645, 50, 10, 96.0),
             st.Word("ls", 40, 60, 16, 10, 96.0), st.Word("Desktop", 1100, 780, 60, 12, 96.0)]
    listing = st.describe(1280, 800, words, parse_windows(LISTING, 1.0, (1280, 800)))
    lines = listing.splitlines()
    front = lines.index('Window "Approval needed [31m \\"quoted\\"" at (534, 661) 212x92, '
                        'centre (640, 707), focused:')
    assert lines[front + 1:front + 3] == ['- "Approval" at (615, 650)', '- "Approve" at (630, 727)']
    assert lines.index('Window "terminal" at (31, 50) 994x544, centre (528, 322):') == front + 3
    assert lines[-2:] == ["Text on no window:", '- "Desktop" at (1130, 786)']


class _Unlisted:
    def __init__(self, error: Exception):
        self.error = error

    def list_windows(self):
        raise self.error


def test_a_guest_without_a_window_list_says_so():
    failed = X11Guest("", exit_code=3, stderr="no windows found on DISPLAY :0\n")
    windows, why = st.guest_windows(failed, 1.0, (1280, 800))
    assert windows == [] and why == "the guest did not list its windows (exit 3: no windows found on DISPLAY :0)."
    gone = _Unlisted(OSError("the SSH connection dropped"))
    assert "SSH connection dropped" in st.guest_windows(gone, 1.0, (1280, 800))[1]
    refused = _Unlisted(GuestError("the desktop session is locked"))
    assert st.guest_windows(refused, 1.0, (1280, 800))[1] == (
        "the guest did not list its windows (the desktop session is locked).")
    assert st.guest_windows(X11Guest("@@active \n"), 1.0, (1280, 800)) == ([], "the guest shows no windows.")
    listing = st.describe(1280, 800, [st.Word("OK", 10, 10, 20, 10, 90.0)], why)
    assert "Windows: the guest did not list its windows (exit 3" in listing
    assert '- "OK" at (20, 15)' in listing


def test_the_listing_is_capped_and_says_what_was_cut():
    words = [st.Word(f"line{n}", 10, 12 * n, 40, 10, 90.0) for n in range(2000)]
    listing = st.describe(1280, 24000, words, [])
    assert len(listing) <= st.TEXT_CAP
    assert '"line0" at (30, 5)' in listing and listing.endswith("read the program's output in the shell ...]")
    assert "more lines cut" in listing
    titles = [st.Window("w" * 500, 0, 0, 100, 100)]
    assert len(st.describe(100, 100, words, titles, cap=1000)) <= 1000


def test_ocr_noise_is_left_out():
    tsv = ("level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\theight\tconf\ttext\n"
           "5\t1\t1\t1\t1\t1\t200\t100\t80\t20\t95.5\tApprove\n"
           "5\t1\t1\t1\t1\t2\t400\t100\t20\t20\t91.0\t|\n"  # a border
           "5\t1\t1\t1\t1\t3\t500\t100\t40\t20\t12.0\tx1l\n"  # unsure
           "5\t1\t1\t1\t1\t4\t9000\t100\t40\t20\t95.0\tfar\n"  # outside the image
           "5\t1\t1\t1\t1\t5\t600\t100\t40\tbad\t95.0\tbroken\n"
           "5\t1\t1\t1\t1\t6\t700\t100\t40\t20\t95.0\tcon\x07trol\n")
    words = st.parse_tsv(tsv, 2, (1280, 800))
    assert [(w.text, w.left, w.top, w.width, w.height) for w in words] == [
        ("Approve", 100, 50, 40, 10), ("con trol", 350, 50, 20, 10)]


# --- through vmd and vmagent --------------------------------------------------------------


def test_the_screenshot_verb_reads_the_screen_only_when_asked(tmp_path, monkeypatch, tesseract):
    image, boxes = render()
    png = png_of(image)
    monkeypatch.setattr(LocalScreen, "screenshot",
                        lambda self, max_age=0.0: Shot(png, 1280, 800, 1.0, 1280, 800))
    ran: list[str] = []
    real_run = LocalGuest.run

    def run(self, command, timeout=300, cwd=None, on_output=None):
        if command == WINDOWS_COMMAND:  # the fake machine is the host: no guest desktop
            ran.append(command)
            return CommandResult(exit_code=0, stdout=LISTING, stderr="", duration=0.1)
        return real_run(self, command, timeout, cwd, on_output)

    monkeypatch.setattr(LocalGuest, "run", run)
    with running_vmd(tmp_path) as vmd:
        client = Vmd(vmd.socket, timeout=60).connect()
        client.call("session_open", os="debian", project="screen")
        client.call("plan_tasks", tasks=["look"])
        client.call("session_ready", timeout=30)
        plain = client.call("screenshot")
        assert "screen_text" not in plain.model_fields_set and not ran  # no OCR, no guest command
        shot = client.call("screenshot", text=True)
        client.close()
    assert ran == [WINDOWS_COMMAND]
    assert 'Window "terminal" at (31, 50)' in shot.screen_text and "screen_text" in shot.text
    point = shot.screen_text.split('"Approve" at (')[1].split(")")[0]
    assert inside(tuple(int(v) for v in point.split(", ")), boxes["Approve"])
    assert base64.b64decode(shot.png_base64) == png


class ScreenVmd:
    """A vmd that answers screenshots, with the screen as text when asked, as the result
    model `Vmd.call` gives (vmagent/link/)."""

    def __init__(self, screen_text: bool = True):
        self.calls: list[dict] = []
        self.screen_text = screen_text

    def call(self, verb, **params):
        assert verb == "screenshot"
        self.calls.append(params)
        result = {"png_base64": "iVBORw0KGgo=", "width": 1280, "height": 800, "scale": 1.0, "path": "shot.png",
                  "text": "screenshot"}
        if params.get("text") and self.screen_text:
            result["screen_text"] = 'The screen (1280x800) read as text\n- "Approve" at (640, 412)'
        return typed_result("screenshot", result)


def test_a_model_that_cannot_see_gets_the_screen_as_text():
    vmd = ScreenVmd()
    outcome = tools.call(vmd, "screenshot", {"text": False}, sees_images=False)
    assert vmd.calls == [{"text": True}]
    lines = outcome.text.splitlines()
    assert lines[0].startswith("NOTE: the model you run on cannot see images")
    assert lines[1:] == ["The screen (1280x800) read as text", '- "Approve" at (640, 412)']
    # kept for the live preview; the loop sends it to the model only when it sees images
    assert outcome.image_b64 == "iVBORw0KGgo=" and outcome.ok


def test_a_model_that_sees_gets_the_image_and_asks_for_text_only_when_it_wants():
    vmd = ScreenVmd()
    outcome = tools.call(vmd, "screenshot", {})
    assert vmd.calls == [{}] and outcome.image_b64 and "read as text" not in outcome.text
    both = tools.call(vmd, "screenshot", {"text": True})
    assert vmd.calls[-1] == {"text": True}
    assert both.text.startswith("screenshot of 1280x800") and '"Approve" at (640, 412)' in both.text


def test_a_vmd_without_screen_text_still_tells_a_blind_model_how_to_read_the_screen():
    outcome = tools.call(ScreenVmd(screen_text=False), "screenshot", {}, sees_images=False)
    assert "cannot see images" in outcome.text and "window titles" in outcome.text
