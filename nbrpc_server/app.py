"""The server extension itself: its endpoints, its message type left untracked, and its
channels closed when the server stops (``stop_extension``)."""

from __future__ import annotations

from jupyter_server.extension.application import ExtensionApp

from .drivers import Drivers
from .handlers import routes
from .protocol import REQUEST


class PanelServerExtension(ExtensionApp):
    """nbrpc's side panel endpoints, at ``<base_url>/nbrpc/...``."""

    name = "nbrpc_server"
    load_other_extensions = True

    def initialize_settings(self) -> None:
        untrack_requests(self.serverapp)
        self.drivers = Drivers(self.serverapp.kernel_manager, self.serverapp.session_manager)
        self.settings["nbrpc_drivers"] = self.drivers

    def initialize_handlers(self) -> None:
        self.handlers.extend(routes())

    async def stop_extension(self) -> None:
        closed = len(self.drivers.channels)
        self.drivers.close()
        self.log.info("nbrpc_server: closed the side panel's channels to %d kernels", closed)


def untrack_requests(server_app) -> None:
    """ipykernel says busy and idle on IOPub around every control request, ours too; a
    message type the kernel manager does not track leaves a kernel's state (and JupyterLab's
    busy indicator, which reads the same list) to its cells."""
    manager = server_app.kernel_manager
    untracked = list(getattr(manager, "untracked_message_types", None) or [])
    if REQUEST not in untracked:
        manager.untracked_message_types = [*untracked, REQUEST]
    page = server_app.web_app.settings.setdefault("page_config_data", {})
    if REQUEST not in page.get("untracked_message_types", [REQUEST]):
        page["untracked_message_types"] = [*page["untracked_message_types"], REQUEST]
