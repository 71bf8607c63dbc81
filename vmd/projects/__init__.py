"""Projects: the folder read as bytes (tree.py), vmd's own repository (repository.py),
commit and push (publish.py, store.py), Gitea (gitea.py) and who owns what on it
(owners.py)."""
