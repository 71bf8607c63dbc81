"""Machines: the port a session uses (port.py), its libvirt implementation (machine.py,
domain_xml.py, images.py, accel.py), the warm pool (warm_pool.py), the egress guard
(egress_guard.py) and the screen (screen.py, keys.py, screen_text.py)."""
