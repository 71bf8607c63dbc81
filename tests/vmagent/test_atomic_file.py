"""Two writers replacing one file at once: neither fails, and the file is one of theirs whole.

CI caught vmd's session.json renamed away from under a second writer (a vmd being stopped
and the one that adopted its session both saved it through one fixed `session.json.tmp`).
"""

from __future__ import annotations

import stat
import threading

from vmagent.atomic_file import replace_text
from vmd.session import disk


def _race(write, path, rounds=300):
    errors: list[BaseException] = []
    texts = {name: name * 2000 for name in ("a", "b", "c")}

    def writer(text):
        try:
            for _ in range(rounds):
                write(path, text)
        except BaseException as exc:  # noqa: BLE001 - the test reports what any writer raised
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t,)) for t in texts.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors, texts


def test_vmagent_writers_of_one_file_do_not_take_each_others_copy(tmp_path):
    path = tmp_path / "job.json"
    errors, texts = _race(replace_text, path)
    assert errors == []
    assert path.read_text() in texts.values()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["job.json"]  # no copy left behind


def test_vmd_writers_of_one_session_json_do_not_take_each_others_copy(tmp_path):
    path = tmp_path / "session.json"
    errors, texts = _race(disk.replace, path)
    assert errors == []
    assert path.read_text() in texts.values()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["session.json"]
