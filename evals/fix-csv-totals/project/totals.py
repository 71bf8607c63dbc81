import csv


def totals(path):
    """{category: sum of amount} of a CSV file with a header row."""
    sums = {}
    with open(path, newline="") as fh:
        for row in csv.reader(fh):
            category, amount = row
            sums[category] = sums.get(category, 0) + float(amount)
    return sums
