import argparse


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("words", nargs="+")
    args = parser.parse_args(argv)
    print(" ".join(args.words))


if __name__ == "__main__":
    main()
