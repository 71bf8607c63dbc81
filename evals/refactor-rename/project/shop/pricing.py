def calc_total(lines):
    """lines: (quantity, unit price) pairs."""
    return sum(q * p for q, p in lines)
