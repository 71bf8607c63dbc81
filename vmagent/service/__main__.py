import sys

from . import serve_main

sys.exit(serve_main(sys.argv[1:]))
