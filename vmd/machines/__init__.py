"""Machines: the port a session uses (port.py), its libvirt implementation (the factory
libvirt_machines.py over machine.py, domain_xml.py, images.py, accel.py), the warm pool and
this host's room for guests (warm_pool.py, host_room.py), the egress guard
(egress_guard.py) and the screen (screen.py, keys.py, screen_text.py, terminal_cells.py)."""
