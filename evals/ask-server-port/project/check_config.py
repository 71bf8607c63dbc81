import configparser
import sys

c = configparser.ConfigParser()
c.read("server.ini")
port = int(c["server"]["port"])
sys.exit(0 if 1 <= port <= 65535 else 1)
