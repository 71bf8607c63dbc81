"""The SSH connection to a guest: one persistent paramiko transport, a channel per command,
one SFTP client; every request bounded in time, and close() never waiting on the guest."""

from __future__ import annotations

import socket
import threading

import paramiko

# How long the guest may take to answer one SSH request: a channel's open, an exec or
# subsystem start, one SFTP reply. A running guest answers these in milliseconds even
# under TCG; one that QEMU paused (its disk could not grow: the host's disk is full) or
# that hung answers never, and paramiko would wait an hour for the open and forever for
# the exec's answer, with the verb, the session and its close waiting behind it.
REQUEST_TIMEOUT_S = 30
SFTP_REPLY_TIMEOUT_S = 60


class GuestNotAnswering(paramiko.SSHException):
    """The guest did not answer an SSH request in time."""


class SshConnection:
    """One persistent paramiko transport per machine; a channel per command."""

    def __init__(self, host: str, port: int, user: str, key_path: str, connect_timeout: float = 10):
        self.host, self.port, self.user = host, port, user
        self.key = paramiko.Ed25519Key.from_private_key_file(key_path)
        self.connect_timeout = connect_timeout
        self._transport: paramiko.Transport | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._sftp_of: paramiko.Transport | None = None  # the transport the SFTP client runs on
        self.request_timeout = REQUEST_TIMEOUT_S
        self.sftp_reply_timeout = SFTP_REPLY_TIMEOUT_S
        self._lock = threading.Lock()  # held only for moments: close() must never wait on the guest

    def transport(self) -> paramiko.Transport:
        with self._lock:
            if self._transport is None or not self._transport.is_active():
                self._sftp = None
                sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
                transport = paramiko.Transport(sock)
                transport.banner_timeout = self.connect_timeout
                try:
                    transport.start_client(timeout=self.connect_timeout)
                    transport.auth_publickey(self.user, self.key)
                except Exception:
                    transport.close()
                    raise
                transport.set_keepalive(15)
                self._transport = transport
            return self._transport

    def open_channel(self, command: str | None = None, subsystem: str | None = None,
                     timeout: float | None = None) -> paramiko.Channel:
        """A new channel running `command` (or `subsystem`), or GuestNotAnswering when the
        guest did not open it and start it within `timeout` s (request_timeout)."""
        timeout = self.request_timeout if timeout is None else timeout
        try:
            channel = self.transport().open_session(timeout=timeout)
        except paramiko.SSHException as exc:
            if "Timeout opening channel" in str(exc):
                raise GuestNotAnswering(f"the guest did not open an SSH channel within {timeout:g} s; "
                                        "it is paused, overloaded or gone") from None
            raise
        expired = threading.Event()

        def expire() -> None:  # closing the channel wakes paramiko's wait for the answer
            expired.set()
            channel.close()

        timer = threading.Timer(timeout, expire)
        timer.daemon = True
        timer.start()
        try:
            if subsystem is not None:
                channel.invoke_subsystem(subsystem)
            else:
                channel.exec_command(command or "")
        except Exception as exc:
            channel.close()
            if expired.is_set():
                raise GuestNotAnswering(f"the guest did not start {subsystem or 'a command'} within "
                                        f"{timeout:g} s; it is paused, overloaded or gone") from None
            raise exc
        finally:
            timer.cancel()
        return channel

    def sftp(self) -> paramiko.SFTPClient:
        """The connection's SFTP client, made on first use. Each reply it waits for is
        bounded (SFTP_REPLY_TIMEOUT_S): a wait past it raises TimeoutError, and the caller
        drops the client (`drop_sftp`), whose requests are out of step from then on."""
        transport = self.transport()
        with self._lock:
            if self._sftp is not None and self._sftp_of is transport:
                return self._sftp
        # Made outside the lock: a guest that stopped answering must not keep close() waiting.
        channel = self.open_channel(subsystem="sftp")
        channel.settimeout(self.sftp_reply_timeout)
        try:
            sftp = paramiko.SFTPClient(channel)
        except Exception:
            channel.close()
            raise
        with self._lock:
            if self._transport is transport and (self._sftp is None or self._sftp_of is not transport):
                self._sftp, self._sftp_of = sftp, transport
                return sftp
            current = self._sftp if self._transport is transport else None
        sftp.close()  # another thread made one meanwhile, or the connection was closed
        if current is None:
            raise paramiko.SSHException("the SSH connection to the guest was closed meanwhile")
        return current

    def drop_sftp(self) -> None:
        """Forgets the SFTP client after one of its replies timed out."""
        with self._lock:
            sftp, self._sftp, self._sftp_of = self._sftp, None, None
        if sftp is not None:
            try:
                sftp.close()
            except Exception:
                pass

    def active(self) -> bool:
        """The transport is up (without connecting when it is not)."""
        transport = self._transport
        return transport is not None and transport.is_active()

    def close(self) -> None:
        with self._lock:
            sftp, transport = self._sftp, self._transport
            self._sftp = self._transport = self._sftp_of = None
        for part in (sftp, transport):  # closing the transport ends every channel on it
            if part is not None:
                try:
                    part.close()
                except Exception:
                    pass
