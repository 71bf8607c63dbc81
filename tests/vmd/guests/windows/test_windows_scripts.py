"""Every PowerShell script the Windows guest backend ships or generates (vmd/guests/windows/scripts.py,
rendered as vmd renders them, and the lines vmd/guests/windows/guest.py sends) parses with a real
PowerShell grammar (tree-sitter-powershell) with no ERROR or MISSING node; the values filled
into a template can never be code; CLIXML from Windows becomes plain text."""

from __future__ import annotations

import base64
import os
import shutil
import string
import subprocess

import pytest
import tree_sitter
import tree_sitter_powershell

from vmd.guests.windows import scripts as ws
from vmd.guests.windows.powershell import b64_utf8, decode_in_shell, in_shell_command, quoted, strip_clixml

PARSER = tree_sitter.Parser(tree_sitter.Language(tree_sitter_powershell.language()))

SAMPLE = dict(SECONDS=300, MAP_SHARE=True, DRIVE_ROOT=quoted("Z:\\"), DRIVE="Z:", SHARE_UNC=quoted(r"\\10.0.2.4\project"),
              SHARE_USER=quoted("vmd"), SHARE_PASSWORD=quoted("Pw4ShareOnly"),
              JOB_DLL=quoted("vmd\\" + ws.JOB_DLL), WINDOWS_DLL=quoted("vmd\\" + ws.WINDOWS_DLL), INNER=quoted(base64.b64encode("'x'".encode("utf-16-le")).decode()),
              TIMEOUT_LINE=quoted(ws.TIMEOUT_LINE), CWD_B64=quoted(b64_utf8("Z:\\src")),
              FILE_B64=quoted(b64_utf8(r"C:\vmd\run\1.ps1")), HOST=quoted("example.com"), TASK=quoted("vmd-launch"),
              MILLIS=1764662400000)


def powershell_problems(script: str) -> list[str]:
    """Where the grammar found an error or had to invent a token, with the text there."""
    tree = PARSER.parse(script.encode("utf-8"))
    problems, stack = [], [tree.root_node]
    while stack:
        node = stack.pop()
        if node.is_error or node.is_missing:
            line = node.start_point[0]
            problems.append(f"line {line + 1}: {node.type}: {script.splitlines()[line] if script else ''}")
        stack.extend(node.children)
    return problems


def test_the_grammar_finds_a_broken_script():
    assert powershell_problems("if ($a { 'x' ") and powershell_problems("$x = @'\nno end")
    assert powershell_problems("$a = 1; if ($a -eq 1) { 'one' } else { exit 2 }") == []


@pytest.mark.parametrize("name", sorted(ws.TEMPLATES))
def test_every_template_parses_as_powershell_once_rendered(name):
    script = ws.render(ws.TEMPLATES[name], **SAMPLE)
    assert "{{" not in script
    assert powershell_problems(script) == [], script


def test_the_command_file_parses_with_its_exit_tail():
    for command in ["python -m pytest -q", "Get-ChildItem | Select-Object -First 3 # a comment",
                    "$x = @'\nhere\n'@\n$x"]:
        assert powershell_problems(command + "\n" + ws.EXIT_TAIL) == []


def test_a_value_can_never_become_code():
    assert ws.render("$a = {{X}}", X=quoted("'; Remove-Item C:\\ -Recurse; '")) == (
        "$a = '''; Remove-Item C:\\ -Recurse; '''")
    for bad in ["$(Remove-Item x)", "'a' + (evil)", "Z:; evil", "1; evil"]:
        with pytest.raises(ValueError, match="must be an integer, a drive or a quoted string"):
            ws.render("$a = {{X}}", X=bad)
    with pytest.raises(ValueError, match="no value"):
        ws.render("$a = {{X}}")
    # The typographic quotes are quotes to PowerShell too: doubled, so the string stays one.
    rendered = ws.render("$a = {{X}}", X=quoted("it\u2019s; evil"))
    assert powershell_problems(rendered) == [] and rendered == "$a = 'it\u2019\u2019s; evil'"


def test_the_exec_line_runs_the_wrapper_in_sshds_own_powershell():
    # Two PowerShell starts per command, not three: sshd's DefaultShell (`powershell.exe -c
    # <line>`) runs the wrapper itself, and the wrapper starts the command's own powershell.exe.
    script = ws.render(ws.RUN_WRAPPER, **SAMPLE)
    line = in_shell_command(script)
    assert decode_in_shell(line) == script and len(line) < 30_000
    assert not line.lower().startswith("powershell") and "powershell" not in line.lower()
    assert script.count("powershell.exe") == 1 and "Start(" in script  # the command's own, the one start
    assert powershell_problems(line) == []  # what sshd's PowerShell parses
    # Win32-OpenSSH hands the line to PowerShell as one argument in double quotes, escaping
    # quotes and backslashes: the line has neither, nor anything else that either would read.
    assert set(line) <= set(string.ascii_letters + string.digits + "$[]().:;&'+/= "), set(line)
    with pytest.raises(ValueError, match="past Windows' limit"):
        in_shell_command("x" * 12_000)
    with pytest.raises(ValueError, match="not vmd's in-shell PowerShell line"):
        decode_in_shell("powershell -EncodedCommand AAAA")


# CLIXML as Windows PowerShell 5.1 writes it to a redirected stderr under -EncodedCommand: the
# header line, then one <Objs> document per write; a progress record (the module-loading one
# every first PowerShell start prints) and error records whose lines end in an escaped CR LF.
# Shapes as quoted in github.com/ansible/ansible issue 67964 and in Microsoft's MS-PSRP
# serialization (2.2.5.1.x: <S> strings, _xHHHH_ escapes of UTF-16 code units).
PROGRESS = ('<Objs Version="1.1.0.1" xmlns="http://schemas.microsoft.com/powershell/2004/04"><Obj S="progress" '
            'RefId="0"><TN RefId="0"><T>System.Management.Automation.PSCustomObject</T><T>System.Object</T></TN>'
            '<MS><I64 N="SourceId">1</I64><PR N="Record"><AV>Preparing modules for first use.</AV><AI>0</AI><Nil />'
            '<PI>-1</PI><PC>-1</PC><T>Completed</T><SR>-1</SR><SD> </SD></PR></MS></Obj></Objs>')
NOT_RECOGNIZED = ('<Objs Version="1.1.0.1" xmlns="http://schemas.microsoft.com/powershell/2004/04">'
                  '<S S="Error">cargo : The term \'cargo\' is not recognized as the name of a cmdlet, function, '
                  'script file, or operable program. Check _x000D__x000A_</S><S S="Error">the spelling of the '
                  'name, or if a path was included, verify that the path is correct and try again._x000D__x000A_'
                  '</S><S S="Error">At line:1 char:1_x000D__x000A_</S><S S="Error">+ cargo build_x000D__x000A_</S>'
                  '<S S="Warning">disk &lt;C:&gt; is 95% full</S></Objs>')


def test_clixml_on_stderr_becomes_the_text_a_person_reads():
    stderr = "#< CLIXML\r\n" + PROGRESS + "#< CLIXML\r\n" + NOT_RECOGNIZED
    text = strip_clixml(stderr)
    assert "Objs" not in text and "Preparing modules" not in text and "CLIXML" not in text
    assert text.replace("\r\n", "\n").splitlines() == [
        "cargo : The term 'cargo' is not recognized as the name of a cmdlet, function, script file, or "
        "operable program. Check ",
        "the spelling of the name, or if a path was included, verify that the path is correct and try again.",
        "At line:1 char:1", "+ cargo build", "WARNING: disk <C:> is 95% full"]


def test_clixml_escapes_of_any_character_and_plain_text_around_blocks():
    emoji = ('<Objs Version="1.1.0.1" xmlns="http://schemas.microsoft.com/powershell/2004/04"><S S="Error">'
             'caf\u00e9 _xD83D__xDE00_ tab_x0009_end_x000A_</S></Objs>')
    assert strip_clixml("before\n#< CLIXML\r\n" + emoji + "after\n") == "before\ncaf\u00e9 \U0001F600 tab\tend\nafter\n"
    assert strip_clixml("no xml here\n") == "no xml here\n"
    cut = "#< CLIXML\r\n<Objs Version=\"1.1.0.1\"><S S=\"Error\">half"  # the output's bounds cut it
    assert strip_clixml(cut) == '<Objs Version="1.1.0.1"><S S="Error">half'


def test_the_csharp_add_type_compiles_as_csharp_5(tmp_path):
    """Add-Type in Windows PowerShell 5.1 compiles with .NET Framework's csc (C# 5). Mono's
    compiler (Debian's mono-mcs) at -langversion:5 checks the same sources here: a source
    that does not compile would fail every command (the job) or every window list."""
    mcs = shutil.which("mcs")
    if mcs is None:
        reason = "mono-mcs is not installed (apt-get install mono-mcs) to compile the C# here"
        if os.environ.get("CI"):  # scripts/setup.sh installs it: in CI a skip would hide a broken source
            pytest.fail(f"the C# check must run in CI, but {reason}", pytrace=False)
        pytest.skip(reason)
    (tmp_path / "job.cs").write_text(ws.JOB_SOURCE)
    (tmp_path / "windows.cs").write_text(ws.WINDOWS_SOURCE)
    for source in ("job", "windows"):
        done = subprocess.run([mcs, "-langversion:5", "-target:library", f"-out:{tmp_path / source}.dll",
                               str(tmp_path / f"{source}.cs")], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    (tmp_path / "broken.cs").write_text(ws.JOB_SOURCE.replace("IntPtr job =", "IntPtr job"))
    broken = subprocess.run([mcs, "-langversion:5", "-target:library", f"-out:{tmp_path / 'broken'}.dll",
                             str(tmp_path / "broken.cs")], capture_output=True, text=True)
    assert broken.returncode != 0  # the compiler here does reject a broken source
