"""vmd's answers as they crossed the socket, for vmd's own tests.

vmagent reads vmd through `vmagent.link.Vmd`, whose `call` answers the verb's result model.
The tests of vmd itself assert on vmd's answer as it sent it (a key, a nested dict, a value
vmd left out): `WireVmd.call` gives that dict back, after the client checked it against the
verb's model (vmd/contract/results.py), so every such test also checks that vmd keeps its
contract. `model_dump(exclude_unset=True)` is the answer as sent: only the keys vmd wrote,
extra keys kept, no defaults added.
"""

from __future__ import annotations

from typing import Any

from vmagent.link import Vmd


class WireVmd(Vmd):
    def call(self, method: str, **params: Any) -> dict:  # type: ignore[override]
        return super().call(method, **params).model_dump(exclude_unset=True)
