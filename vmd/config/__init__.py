"""vmd's settings: every number and name a person may tune, each with its reason.

- settings.py: `VmdConfig`, read from an optional TOML file (VMD_CONFIG) and the
  environment (`ENV_FIELDS`) by `VmdConfig.load`, the only reader of settings: the rest of
  vmd is handed a config; `VmdConfigError` names each setting that cannot be used.
- egress_allow.py: `Allowed`, an entry of the egress allow-list (`egress_allow`).
- gitea_names.py: Gitea's name rules and the Gitea owner mapping's settings they check
  (`gitea_org`, `gitea_users`).

These stand below every part of vmd that reads a setting: they import none of them.
"""

from vmd.config.settings import ENV_FIELDS, VmdConfig, VmdConfigError

__all__ = ["VmdConfig", "VmdConfigError", "ENV_FIELDS"]
