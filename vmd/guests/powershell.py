"""Windows PowerShell 5.1 as vmd speaks it over SSH: the `-EncodedCommand` line, PowerShell's
single-quoted strings, and CLIXML taken out of stderr.

Why -EncodedCommand: sshd on Windows hands an exec request to its DefaultShell (PowerShell,
set by the image: vmd/guests/windows_contract.py), which would parse vmd's text once
more; a base64 of UTF-16LE has no quote, semicolon or backslash to misread and no code page
to pass through. Why CLIXML: powershell.exe started with -EncodedCommand and its stderr not
a console writes its error, warning and progress records to stderr as serialized XML
(`#< CLIXML` and an `<Objs ...>` document per write, a CR LF in a record's text escaped as
`_x000D__x000A_`); the model must read the text, not the XML. Ansible's PowerShell shell
plugin meets the same blocks over the same transport (github.com/ansible/ansible issue 67964).
"""

from __future__ import annotations

import base64
import html
import re

POWERSHELL = "powershell"
# Every command line vmd sends: no profile (a profile's output or error is not the command's),
# nothing that waits for a person, a script that is no file (so no execution policy applies).
ENCODED_PREFIX = f"{POWERSHELL} -NoProfile -NonInteractive -EncodedCommand "
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


def encoded_command(script: str) -> str:
    """The line that runs `script` in Windows PowerShell: base64 of its UTF-16LE text."""
    line = ENCODED_PREFIX + base64.b64encode(script.encode("utf-16-le")).decode("ascii")
    if len(line) > COMMAND_LINE_MAX:
        raise ValueError(f"a PowerShell command line of {len(line)} characters is past Windows' limit")
    return line


def decode_command(line: str) -> str:
    """The script of an `encoded_command` line (the tests' SSH server reads them back with it)."""
    if not line.startswith(ENCODED_PREFIX):
        raise ValueError(f"not an encoded PowerShell line: {line[:80]!r}")
    return base64.b64decode(line[len(ENCODED_PREFIX):], validate=True).decode("utf-16-le")


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
