"""Network addresses: which local address reaches the workers, and which interface owns it.

TensorPipe's TCP transport listens on the interface named by ``TP_SOCKET_IFNAME``
and advertises that interface's address to its peers, so a member must be told the
interface that owns the address its peers can reach.
"""

from __future__ import annotations

import ipaddress
import socket

import psutil

from .._util import LOOPBACK

# Any routable address works: connecting a UDP socket sends nothing, it only asks
# the kernel which source address its routes would use.
_PROBE = "192.0.2.1"


def interface_addresses() -> dict[str, list[str]]:
    """Each network interface with IPv4 addresses, mapped to them (psutil: any length of
    name, every address an interface has)."""
    found = {}
    for name, addresses in psutil.net_if_addrs().items():
        ipv4 = [a.address for a in addresses if a.family == socket.AF_INET]
        if ipv4:
            found[name] = ipv4
    return found


def interface_of(address: str) -> str | None:
    """The interface that owns ``address`` on this machine, or None."""
    for name, owned in interface_addresses().items():
        if address in owned:
            return name
    return None


def source_address(peer: str) -> str:
    """The local address this machine's routes use to reach ``peer``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((socket.gethostbyname(peer), 9))
        return sock.getsockname()[0]


def resolve_bind(bind: str | None, toward: str | None = None) -> tuple[str, str]:
    """``(address, interface)`` to listen on for workers on other machines.

    ``bind`` is an address of this machine or an interface name; without it, the
    address that routes toward ``toward`` (a worker host) or the default route.
    """
    owned = interface_addresses()
    if bind:
        if bind in owned:
            return owned[bind][0], bind
        try:
            address = socket.gethostbyname(bind)
        except OSError as e:
            raise ValueError(f"bind={bind!r} is neither an interface nor an address here: {e}") from e
        if ipaddress.ip_address(address).is_unspecified:
            raise ValueError(
                f"bind={bind!r} would listen on every interface; give the one address "
                f"that reaches the workers (this machine has: {_listing(owned)})"
            )
        interface = interface_of(address)
        if interface is None:
            raise ValueError(f"{address} is not an address of this machine; choose one of: {_listing(owned)}")
        return address, interface
    try:
        address = source_address(toward or _PROBE)
    except OSError as e:
        raise ValueError(
            f"cannot tell which address reaches {toward or 'other machines'} ({e.strerror or e}); "
            f"pass bind=ADDRESS (%rpc_init --bind ADDRESS), one of: {_listing(owned)}"
        ) from e
    interface = interface_of(address)
    if interface is None or address == LOOPBACK:
        raise ValueError(f"no network address reaches other machines; pass bind=ADDRESS, one of: {_listing(owned)}")
    return address, interface


def _listing(owned: dict[str, list[str]]) -> str:
    return ", ".join(f"{address} ({name})" for name, addresses in owned.items() for address in addresses) or "none"
