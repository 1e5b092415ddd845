"""``<base_url>/nbrpc/...``: the side panel's endpoints, each behind the server's
authentication (a token or a login) and, for a POST, its XSRF check.

- ``GET  nbrpc/clusters``: every cluster of this server's kernels (``Drivers.clusters``).
- ``GET  nbrpc/clusters/<kernel_id>/views/<view>``: one view as HTML, drawn by the kernel.
- ``POST nbrpc/clusters/<kernel_id>/interrupt``: stop the stuck call (what the stop
  button does: interrupt the kernel).

A kernel that this server's kernel manager does not own is 404; a view of a kernel of this
server that runs no cluster (any more) answers ``{"ended": true}``.
"""

from __future__ import annotations

import json

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from .drivers import REQUEST, Drivers

KERNEL = r"(?P<kernel_id>[0-9a-f-]{1,64})"
VIEW = r"(?P<view>[a-z]{1,16})"


class _Handler(APIHandler):
    @property
    def drivers(self) -> Drivers:
        return self.settings["nbrpc_drivers"]

    def _no_cluster(self, kernel_id: str):
        raise tornado.web.HTTPError(
            404, f"kernel {kernel_id} of this server runs no nbrpc cluster (or is not this server's); "
                 "start one in its notebook with %rpc_init")


class ClustersHandler(_Handler):
    @tornado.web.authenticated
    async def get(self):
        members = self.get_argument("members", "1") != "0"
        self.finish(json.dumps({"clusters": await self.drivers.clusters(members)}))


class ViewHandler(_Handler):
    @tornado.web.authenticated
    async def get(self, kernel_id: str, view: str):
        if self.drivers.owned(kernel_id) is None:
            self._no_cluster(kernel_id)
        answer = await self.drivers.view(kernel_id, view)
        # A view of a cluster that ended says so (and stops asking).
        self.finish(json.dumps(answer if answer is not None else {"ended": True, "html": "",
                                                                   "summary": "the cluster has ended"}))


class InterruptHandler(_Handler):
    @tornado.web.authenticated
    async def post(self, kernel_id: str):
        if self.drivers.owned(kernel_id) is None:
            self._no_cluster(kernel_id)
        await self.kernel_manager.interrupt_kernel(kernel_id)
        self.finish(json.dumps({"interrupted": kernel_id}))


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


def setup_handlers(server_app) -> None:
    untrack_requests(server_app)
    web_app = server_app.web_app
    drivers = Drivers(server_app.kernel_manager, server_app.session_manager)
    web_app.settings["nbrpc_drivers"] = drivers
    base = url_path_join(web_app.settings["base_url"], "nbrpc")
    web_app.add_handlers(".*$", [
        (url_path_join(base, "clusters") + "/?", ClustersHandler),
        (url_path_join(base, "clusters", KERNEL, "views", VIEW) + "/?", ViewHandler),
        (url_path_join(base, "clusters", KERNEL, "interrupt") + "/?", InterruptHandler),
    ])
