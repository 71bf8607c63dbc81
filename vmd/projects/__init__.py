"""Projects: the folder read as bytes (tree.py), vmd's own repository of it (repository.py),
and its way out: what a session uses (store.py: `ProjectStore` restores a project at open;
a `Publication` commits and pushes it, its `Remote`, remote.py, resolved once), the I/O of
restoring, committing and pushing (publish.py), Gitea's REST API (gitea.py), who owns a
project on Gitea, planned from the settings alone (owners.py), and how a push stands
(push_state.py)."""
