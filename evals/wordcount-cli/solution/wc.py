import sys
def counts(text):
    return len(text.splitlines()), len(text.split()), len(text)
def main(argv):
    if len(argv) > 1:
        try:
            text = open(argv[1]).read()
        except OSError as e:
            print(f"wc.py: {e}", file=sys.stderr); return 1
    else:
        text = sys.stdin.read()
    print(*counts(text)); return 0
if __name__ == "__main__":
    sys.exit(main(sys.argv))
