from shop.pricing import order_total


def checkout(lines, discount=0.0):
    return round(order_total(lines) * (1 - discount), 2)
