"""Checks of the project itself: the layering, the README's settings, docker-compose.yml, the
xdist lanes, the stand-ins against their upstream."""
