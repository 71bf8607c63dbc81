"""Screen coordinates (vmd/machines/screen.py): a point in the screenshot the agent was shown maps
back through the framebuffer to the USB tablet's absolute axis, and a point outside the
shown image is refused with its size."""

from __future__ import annotations

import pytest

from vmd.machines.screen import ABS_MAX, Screen, ScreenError


def _screen(shown: tuple[int, int], framebuffer: tuple[int, int]) -> Screen:
    screen = Screen(domain=None, size=shown)
    screen._source = framebuffer  # as after a screenshot of that framebuffer
    return screen


def test_corners_of_an_unscaled_screen_are_the_ends_of_the_axis():
    screen = _screen((1280, 800), (1280, 800))
    assert screen._abs(0, 0) == (0, 0)
    assert screen._abs(1279, 799) == (ABS_MAX, ABS_MAX)
    assert screen._abs(640, 400) == (round(640 * ABS_MAX / 1279), round(400 * ABS_MAX / 799))


def test_a_scaled_down_screenshot_maps_back_to_the_framebuffer():
    # A 2560x1600 framebuffer shown at 1280x800: shown pixel (x, y) is framebuffer (2x, 2y).
    screen = _screen((1280, 800), (2560, 1600))
    assert screen._abs(640, 400) == (round(1280 * ABS_MAX / 2559), round(800 * ABS_MAX / 1599))
    assert screen._abs(0, 0) == (0, 0)


def test_a_smaller_framebuffer_is_not_scaled_up():
    screen = _screen((1280, 800), (1024, 768))
    assert screen._abs(1023, 767) == (ABS_MAX, ABS_MAX)
    with pytest.raises(ScreenError, match="1024x768"):
        screen._abs(1024, 10)


@pytest.mark.parametrize("point", [(-1, 0), (0, -1), (1280, 0), (0, 800)])
def test_a_point_outside_the_shown_screen_is_refused_with_its_size(point):
    screen = _screen((1280, 800), (2560, 1600))
    with pytest.raises(ScreenError, match="1280x800 in screenshot pixels"):
        screen._abs(*point)
