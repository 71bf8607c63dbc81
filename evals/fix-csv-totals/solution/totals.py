import csv


def totals(path):
    """{category: sum of amount} of a CSV file with a header row."""
    sums = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            if not row.get("category"):
                continue
            sums[row["category"]] = sums.get(row["category"], 0) + float(row["amount"])
    return sums
