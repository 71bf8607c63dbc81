"""Screenshots of an unchanged screen (vmd/machines/screen.py): the same framebuffer is not
decoded, scaled and encoded again, a changed one is, and the live preview may reuse a
look taken a moment ago instead of capturing again."""

from __future__ import annotations

import io

import pytest
from PIL import Image, ImageDraw

from vmd.machines.screen import Screen, ScreenError


def ppm(size=(1280, 800), mark=(10, 10)) -> bytes:
    image = Image.new("RGB", size, (40, 60, 90))
    ImageDraw.Draw(image).rectangle([mark, (mark[0] + 50, mark[1] + 20)], fill=(250, 250, 250))
    buf = io.BytesIO()
    image.save(buf, format="PPM")
    return buf.getvalue()


class CountingScreen(Screen):
    """A Screen whose framebuffer is a list of frames, counting captures and encodes."""

    def __init__(self, frames: list[bytes], size=(1280, 800)):
        super().__init__(domain=None, size=size)
        self.frames = frames
        self.captures = 0
        self.encodes = 0

    def grab_raw(self) -> bytes:
        self.captures += 1
        return self.frames[min(self.captures, len(self.frames)) - 1]

    def _encode(self, raw: bytes):
        self.encodes += 1
        return super()._encode(raw)


def test_an_unchanged_frame_is_captured_but_not_encoded_again():
    frame = ppm()
    screen = CountingScreen([frame, frame, frame])
    first = screen.screenshot()
    second = screen.screenshot()
    third = screen.screenshot()
    assert screen.captures == 3  # every look asks the guest: the screen may have changed
    assert screen.encodes == 1
    assert first.png == second.png == third.png
    decoded = Image.open(io.BytesIO(second.png))
    assert decoded.size == (1280, 800) and decoded.getpixel((20, 15)) == (250, 250, 250)


def test_a_changed_frame_is_encoded_and_shows_the_change():
    screen = CountingScreen([ppm(mark=(10, 10)), ppm(mark=(600, 400))])
    before = screen.screenshot()
    after = screen.screenshot()
    assert screen.encodes == 2 and before.png != after.png
    assert Image.open(io.BytesIO(after.png)).getpixel((610, 405)) == (250, 250, 250)


def test_a_new_resolution_moves_the_coordinate_mapping_with_it():
    screen = CountingScreen([ppm((1280, 800)), ppm((2560, 1600))])
    screen.screenshot()
    assert screen._source == (1280, 800)
    shot = screen.screenshot()
    assert screen._source == (2560, 1600) and (shot.width, shot.height, shot.scale) == (1280, 800, 0.5)


def test_the_preview_reuses_a_look_taken_within_max_age_and_captures_after_it():
    screen = CountingScreen([ppm(mark=(10, 10)), ppm(mark=(600, 400))])
    agent = screen.screenshot()
    preview = screen.screenshot(max_age=60)
    assert screen.captures == 1 and preview is agent
    later = screen.screenshot(max_age=0)
    assert screen.captures == 2 and later.png != agent.png


def test_a_frame_that_is_not_an_image_says_to_take_it_again():
    screen = CountingScreen([b"P6 garbage"])
    with pytest.raises(ScreenError, match="take the screenshot again"):
        screen.screenshot()
