"""Key names and typed characters become the QMP qcodes of a US keyboard (vmd/machines/keys.py)."""

from __future__ import annotations

import string

import pytest

from vmd.machines.keys import UnknownKey, char_keys, key_qcode, parse_combo


@pytest.mark.parametrize("combo, codes", [
    ("ctrl+alt+t", ["ctrl", "alt", "t"]),
    ("shift+Tab", ["shift", "tab"]),
    ("Return", ["ret"]),
    ("Page_Down", ["pgdn"]),
    ("super", ["meta_l"]),
    ("F5", ["f5"]),
    ("ctrl + c", ["ctrl", "c"]),  # spaces around '+' are what people write
])
def test_key_names_are_read_the_way_people_write_them(combo, codes):
    assert parse_combo(combo) == codes


def test_a_capital_letter_or_a_shifted_sign_in_a_combo_adds_shift():
    assert parse_combo("ctrl+A") == ["ctrl", "shift", "a"]
    assert parse_combo("ctrl+!") == ["ctrl", "shift", "1"]


def test_a_lone_plus_is_the_plus_key_not_a_separator():
    assert parse_combo("+") == parse_combo("plus") == ["shift", "equal"]


@pytest.mark.parametrize("combo", ["ctrl++", "", "ctrl+"])
def test_a_combo_with_an_empty_part_is_refused_with_an_example(combo):
    with pytest.raises(UnknownKey, match="ctrl\\+c"):
        parse_combo(combo)


def test_an_unknown_key_name_lists_the_valid_ones():
    with pytest.raises(UnknownKey) as err:
        key_qcode("hyper")
    assert "'hyper'" in str(err.value) and "ctrl" in str(err.value) and "a-z" in str(err.value)


def test_every_printable_ascii_character_can_be_typed():
    for ch in string.printable.replace("\x0b", "").replace("\x0c", ""):
        shift, code = char_keys(ch)
        assert isinstance(shift, bool) and code


@pytest.mark.parametrize("ch, keys", [
    ("a", (False, "a")), ("A", (True, "a")), ("7", (False, "7")), ("&", (True, "7")),
    ("_", (True, "minus")), ("\n", (False, "ret")), ("\r", (False, "ret")), ("\t", (False, "tab")),
    (" ", (False, "spc")), ('"', (True, "apostrophe")),
])
def test_typed_characters_carry_the_shift_state_of_a_us_layout(ch, keys):
    assert char_keys(ch) == keys


def test_a_character_beyond_ascii_is_refused_with_what_to_do_instead():
    with pytest.raises(UnknownKey, match="write_file"):
        char_keys("é")
