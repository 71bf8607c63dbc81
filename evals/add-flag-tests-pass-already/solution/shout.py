import argparse


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--upper", action="store_true")
    parser.add_argument("words", nargs="+")
    args = parser.parse_args(argv)
    text = " ".join(args.words)
    print(text.upper() if args.upper else text)


if __name__ == "__main__":
    main()
