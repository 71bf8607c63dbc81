from shop.pricing import calc_total


def checkout(lines, discount=0.0):
    return round(calc_total(lines) * (1 - discount), 2)
