"""A page server on 127.0.0.1 for read_page's tests: documentation pages, a 10 MiB page,
a page that trickles in, redirect chains, and the kinds read_page reads or refuses.
Every request is counted by path, so a test sees what reached the server and what the
cache kept from it."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.parse
from collections import Counter
from http.server import BaseHTTPRequestHandler

from tests.support.http_stand_in import StandInHTTPServer

DOC_HTML = """<!doctype html><html><head><meta charset="utf-8"><title>Frobnicate API reference</title></head>
<body><nav><a href="/">Home</a> | <a href="/about">About us</a></nav>
<main><article>
<h1>Frobnicate API</h1>
<p>The <code>frob</code> library frobnicates widgets. See the <a href="https://frob.example/guide">full guide</a>
for the design notes.</p>
<h2>Install and call</h2>
<pre><code class="language-python">import frob
widgets = frob.frobnicate(3, mode="fast")
</code></pre>
<p>Call <code>frobnicate</code> with a count and a mode. It returns a list of widgets, one per count,
and raises ValueError for a negative count.</p>
<h2>Modes</h2>
<ul><li>fast: no checks</li><li>careful: checks every widget</li></ul>
<h2>Changelog</h2>
{changelog}
<p>END-OF-DOC-MARKER</p>
</article></main><footer>Copyright nobody</footer></body></html>"""
CHANGELOG = "\n".join(f"<p>Release 1.{n}: widget number {n} now frobnicates {n * 7} times faster than before.</p>"
                      for n in range(120))
BIG_BYTES = 10 * 1024 * 1024
# A one-page PDF whose text is "Frob PDF manual" (Helvetica, hand-written, offsets computed below).
_PDF_OBJECTS = [
    b"<< /Type /Catalog /Pages 2 0 R >>",
    b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
    b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 100] /Contents 4 0 R "
    b"/Resources << /Font << /F1 5 0 R >> >> >>",
    None,  # the content stream, below
    b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
]
_PDF_STREAM = b"BT /F1 12 Tf 20 50 Td (Frob PDF manual) Tj ET"


def pdf_bytes() -> bytes:
    objects = list(_PDF_OBJECTS)
    objects[3] = b"<< /Length %d >>\nstream\n%s\nendstream" % (len(_PDF_STREAM), _PDF_STREAM)
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for n, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (n, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def slow_pdf_bytes(pages: int = 40, ops: int = 50_000) -> bytes:
    """A 3 KB PDF that takes pypdf over a second a page: one compressed content stream of `ops`
    text operators, drawn on every page (the shape of the issue's 8 KB PDF)."""
    import io

    from pypdf import PdfWriter
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    writer = PdfWriter()
    stream = DecodedStreamObject()
    stream.set_data(b"BT /F1 12 Tf " + b"(a) Tj 1 0 Td " * ops + b"ET")
    content = writer._add_object(stream.flate_encode())
    font = writer._add_object(DictionaryObject({NameObject("/Type"): NameObject("/Font"),
                                                NameObject("/Subtype"): NameObject("/Type1"),
                                                NameObject("/BaseFont"): NameObject("/Helvetica")}))
    for _ in range(pages):
        page = writer.add_blank_page(200, 200)
        page[NameObject("/Contents")] = content
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})})
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


class PageServer:
    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.hosts: list[str] = []  # the Host header of each request
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                server.hits[url.path] += 1
                server.hosts.append(self.headers.get("Host", ""))
                try:
                    server.route(self, url.path, urllib.parse.parse_qs(url.query))
                except (BrokenPipeError, ConnectionResetError):
                    pass  # read_page stopped reading, as it should at its limits

        self.httpd = StandInHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def route(self, h: BaseHTTPRequestHandler, path: str, query: dict) -> None:
        if path == "/docs":
            return _send(h, 200, "text/html; charset=utf-8", DOC_HTML.replace("{changelog}", CHANGELOG).encode())
        if path == "/text":
            return _send(h, 200, "text/plain", b"plain words\nsecond line\n")
        if path == "/deep.json":  # json would recurse 10,000 levels into it
            return _send(h, 200, "application/json", b'{"a": ' + b"[" * 10_000 + b"]" * 10_000 + b"}")
        if path == "/json":
            return _send(h, 200, "application/json", json.dumps({"name": "frob", "version": "1.2"}).encode())
        if path == "/slow.pdf":
            return _send(h, 200, "application/pdf", slow_pdf_bytes())
        if path == "/manual.pdf":
            return _send(h, 200, "application/pdf", pdf_bytes())
        if path == "/logo.png":
            return _send(h, 200, "image/png", b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
        if path == "/missing":
            return _send(h, 404, "text/html", b"<h1>Not found</h1>")
        if path == "/big":
            h.send_response(200)
            h.send_header("Content-Type", "text/plain")
            h.send_header("Content-Length", str(BIG_BYTES))
            h.end_headers()
            line = b"0123456789abcdef" * 63 + b"big page line\n"  # 1 KiB
            for _ in range(BIG_BYTES // len(line)):
                h.wfile.write(line)
            return None
        if path == "/slow":  # 256 bytes every 0.1 s for a minute
            h.send_response(200)
            h.send_header("Content-Type", "text/plain")
            h.send_header("Content-Length", str(256 * 600))
            h.end_headers()
            for n in range(600):
                h.wfile.write((f"slow line {n:04d} ".ljust(255, ".") + "\n").encode())
                h.wfile.flush()
                time.sleep(0.1)
            return None
        if path.startswith("/hop/"):  # /hop/N: N redirects, the last to the text page
            left = int(path.rsplit("/", 1)[1])
            return _redirect(h, f"/hop/{left - 1}" if left > 1 else "/text")
        if path == "/to":  # a redirect to wherever ?u= says
            return _redirect(h, query["u"][0])
        return _send(h, 404, "text/plain", b"no such page")

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _send(h: BaseHTTPRequestHandler, status: int, content_type: str, body: bytes) -> None:
    h.send_response(status)
    h.send_header("Content-Type", content_type)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def _redirect(h: BaseHTTPRequestHandler, location: str) -> None:
    h.send_response(302)
    h.send_header("Location", location)
    h.send_header("Content-Length", "0")
    h.end_headers()


class Listener:
    """A listening socket on 127.0.0.1 that no test allows: `accepted()` says whether any
    connection reached it (the guard must refuse before one is made)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]

    def accepted(self) -> int:
        count = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1

    def close(self) -> None:
        self.sock.close()


class TlsPageServer(PageServer):
    """The page server over TLS with a certificate for `name` from a CA of the test's own;
    `names` lists the server name (SNI) each handshake asked for."""

    def __init__(self, name: str) -> None:
        import ssl
        import tempfile

        self.names: list[str | None] = []
        ca_pem, cert_pem, key_pem = _certificates(name)
        folder = tempfile.mkdtemp(prefix="pt-web-tls-")
        cert_file, key_file = f"{folder}/cert.pem", f"{folder}/key.pem"
        with open(cert_file, "wb") as f:
            f.write(cert_pem)
        with open(key_file, "wb") as f:
            f.write(key_pem)
        server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_context.load_cert_chain(cert_file, key_file)
        server_context.sni_callback = lambda sock, server_name, ctx: self.names.append(server_name)
        self.client_context = ssl.create_default_context(cadata=ca_pem.decode())
        super().__init__()
        self.httpd.socket = server_context.wrap_socket(self.httpd.socket, server_side=True)
        self.base = f"https://{name}:{self.port}"


def _certificates(name: str) -> tuple[bytes, bytes, bytes]:
    """A CA and a server certificate for `name`, signed by it (PEM)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return (ca.public_bytes(pem), cert.public_bytes(pem),
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
