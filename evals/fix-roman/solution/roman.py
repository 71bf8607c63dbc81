NUMERALS = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"), (50, "L"), (40, "XL"),
            (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]


def to_roman(n):
    if not 0 < n < 4000:
        raise ValueError(f"{n} is out of range 1..3999")
    out = ""
    for value, letters in NUMERALS:
        while n >= value:
            out += letters
            n -= value
    return out
