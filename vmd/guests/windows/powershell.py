"""Windows PowerShell 5.1 as vmd speaks it over SSH: the exec line, PowerShell's single-quoted
strings, and CLIXML taken out of stderr.

Why base64: sshd on Windows hands an exec request to its DefaultShell (PowerShell, set by
the image: vmd/guests/windows/contract.py) as `powershell.exe -c <line>`, which parses
vmd's text once more; a base64 of UTF-16LE has no quote, semicolon or backslash to misread
and no code page to pass through. The line decodes it and runs it in that same PowerShell
(`in_shell_command`); the command's own powershell.exe gets its script as -EncodedCommand
(scripts.py RUN_WRAPPER). Why CLIXML: powershell.exe started with -EncodedCommand and
its stderr not a console writes its error, warning and progress records to stderr as serialized XML
(`#< CLIXML` and an `<Objs ...>` document per write, a CR LF in a record's text escaped as
`_x000D__x000A_`); the model must read the text, not the XML. Ansible's PowerShell shell
plugin meets the same blocks over the same transport (github.com/ansible/ansible issue 67964).
"""

from __future__ import annotations

import base64
import html
import re

IN_SHELL_PREFIX = "$vmdScript = [Text.Encoding]::Unicode.GetString([Convert]::FromBase64String('"
IN_SHELL_SUFFIX = "')); & ([ScriptBlock]::Create($vmdScript))"
# CreateProcess takes a command line of at most 32,767 characters: sshd's own `-c` around ours
# must fit too, so vmd's line stays under this.
COMMAND_LINE_MAX = 30_000

# A block and the line end after it, if any: a block whose records are all progress leaves
# no empty line behind (the records' own lines end in their escaped CR LF).
_OBJS = re.compile(r"<Objs\b[^>]*>.*?</Objs>(?:\r?\n)?", re.DOTALL)
_HEADER = re.compile(r"#< CLIXML\r?\n?")
# A stream record: <S S="Error">text</S> (also Warning, Verbose, Debug, Information). Progress
# records are <Obj S="progress">, never <S>: they are dropped whole.
_STRING = re.compile(r'<S S="(\w+)">(.*?)</S>', re.DOTALL)
_ESCAPE_RUN = re.compile(r"(?:_x[0-9A-Fa-f]{4}_)+")


def in_shell_command(script: str) -> str:
    """A line that runs `script` inside the PowerShell sshd starts for the exec request (its
    DefaultShell, `powershell.exe -c <line>`), with no powershell.exe of its own: one process
    start fewer per command than a `powershell -EncodedCommand` line. The script travels as
    base64 of UTF-16LE (as -EncodedCommand's does), decoded into a script block; the line holds only letters,
    digits and `$[]().:;&'+/= `, so neither Win32-OpenSSH's quoting of the argument (one
    pair of double quotes around it) nor PowerShell's parse of it changes a thing. `exit N`
    in the script ends that shell with N, so the channel's exit status is the script's."""
    payload = base64.b64encode(script.encode("utf-16-le")).decode("ascii")
    line = IN_SHELL_PREFIX + payload + IN_SHELL_SUFFIX
    if len(line) > COMMAND_LINE_MAX:
        raise ValueError(f"a PowerShell command line of {len(line)} characters is past Windows' limit")
    return line


def decode_in_shell(line: str) -> str:
    """The script of an `in_shell_command` line (the tests' SSH server reads them back with it)."""
    if not (line.startswith(IN_SHELL_PREFIX) and line.endswith(IN_SHELL_SUFFIX)):
        raise ValueError(f"not vmd's in-shell PowerShell line: {line[:80]!r}")
    payload = line[len(IN_SHELL_PREFIX):-len(IN_SHELL_SUFFIX)]
    return base64.b64decode(payload, validate=True).decode("utf-16-le")


def quoted(text: str) -> str:
    """`text` as a PowerShell single-quoted string: nothing in it expands; a quote is doubled
    (PowerShell also takes the typographic quotes U+2018/2019/201A/201B as quotes: doubled too)."""
    return "'" + re.sub(r"(['\u2018\u2019\u201a\u201b])", r"\1\1", text) + "'"


def b64_utf8(text: str) -> str:
    """`text` as base64 of UTF-8, for a script to decode: only [A-Za-z0-9+/=] reach the script."""
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def _unescape(text: str) -> str:
    """CLIXML's `_xHHHH_` escapes (UTF-16 code units, surrogate pairs included) as text."""
    def decode(match: re.Match) -> str:
        hexes = re.findall(r"_x([0-9A-Fa-f]{4})_", match.group(0))
        data = b"".join(int(h, 16).to_bytes(2, "little") for h in hexes)
        return data.decode("utf-16-le", "replace")

    return _ESCAPE_RUN.sub(decode, text)


def _records(objs: str) -> str:
    lines = []
    for stream, body in _STRING.findall(objs):
        text = _unescape(html.unescape(body))
        lines.append(text if stream == "Error" else f"{stream.upper()}: {text}")
    return "".join(lines)


def strip_clixml(text: str) -> str:
    """`text` (a stderr) with every CLIXML block replaced by the plain text of its records:
    errors as they are, warnings and the like named, progress dropped. Text around the blocks
    stays; a block cut in the middle (the output's bounds) is left as it came."""
    if "<Objs" not in text and "#< CLIXML" not in text:
        return text
    text = _OBJS.sub(lambda m: _records(m.group(0)), text)
    return _HEADER.sub("", text)


def plain_lines(text: str) -> str:
    """Windows' CR LF line ends as LF, the way every other output reaches the model."""
    return text.replace("\r\n", "\n")
