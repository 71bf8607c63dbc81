"""The web, read on the host for the agent while its guest stays offline.

- guard.py: the SSRF guard every URL fetched on a model's or a person's behalf passes
  (public addresses only, unless the operator's allow-list, allow_list.py, admits one),
  and the network backend that connects only to the address it checked.
- fetch.py: one guarded GET with its redirects, size and time limits.
- page.py: read_page, a page as framed, paged, cached text (HTML as markdown).
- search.py: web_search, against SearXNG, Brave or Tavily.
"""
