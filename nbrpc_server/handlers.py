"""``<base_url>/nbrpc/...``: the side panel's endpoints, each behind the server's
authentication (a token or a login), its XSRF check for a POST, and its authorization
for the "kernels" resource (``auth_resource``), as jupyter_server's own kernel handlers.

- ``GET  nbrpc/clusters``: every cluster of this server's kernels (``Drivers.clusters``).
- ``GET  nbrpc/clusters/<kernel_id>/views/<view>``: one view, drawn by the kernel: the state
  its widget's traits would hold (the stacks: HTML); ``?front_end=1`` adds the widget's ES
  module and CSS, and each of ``VIEW_OPTIONS`` (``?show_forks=1``) is passed on.
- ``POST nbrpc/clusters/<kernel_id>/start``: run the form's ``%rpc_init`` line (JSON
  ``{"line": ...}``) in that kernel, as a cell.
- ``POST nbrpc/clusters/<kernel_id>/shutdown``: ``%rpc_shutdown``, on the control channel.
- ``POST nbrpc/clusters/<kernel_id>/interrupt``: stop the stuck call (the notebook's stop
  button: interrupt the kernel).

A kernel that this server's kernel manager does not own is 404; a view of a kernel of this
server that runs no cluster (any more) answers ``{"ended": true}``.
"""

from __future__ import annotations

import json

import tornado.web
from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler

from .drivers import Drivers
from .protocol import VIEW_OPTIONS, VIEWS

KERNEL = r"(?P<kernel_id>[0-9a-f-]{1,64})"
VIEW = r"(?P<view>[a-z]{1,16})"
ENDED = {"ended": True, "summary": "the cluster has ended"}


class _Handler(APIHandler):
    auth_resource = "kernels"

    @property
    def drivers(self) -> Drivers:
        return self.settings["nbrpc_drivers"]

    def _owned(self, kernel_id: str) -> None:
        if self.drivers.owned(kernel_id) is None:
            raise tornado.web.HTTPError(404, f"kernel {kernel_id} is not a kernel of this server")

    def _no_cluster(self, kernel_id: str):
        raise tornado.web.HTTPError(
            404, f"kernel {kernel_id} of this server runs no nbrpc cluster; "
                 "start one in its notebook with %rpc_init")


class ClustersHandler(_Handler):
    @tornado.web.authenticated
    @authorized
    async def get(self):
        members = self.get_argument("members", "1") != "0"
        self.finish(json.dumps({"clusters": await self.drivers.clusters(members)}))


class ViewHandler(_Handler):
    @tornado.web.authenticated
    @authorized
    async def get(self, kernel_id: str, view: str):
        self._owned(kernel_id)
        if view not in VIEWS:
            raise tornado.web.HTTPError(404, f"no view named {view!r}; the views are: {', '.join(VIEWS)}")
        options = {name: self.get_argument(name, "0") == "1" for name in VIEW_OPTIONS}
        answer = await self.drivers.view(kernel_id, view, self.get_argument("front_end", "0") == "1", options)
        # A view of a cluster that ended says so (and stops asking).
        self.finish(json.dumps(answer if answer is not None else ENDED))


class StartHandler(_Handler):
    @tornado.web.authenticated
    @authorized
    async def post(self, kernel_id: str):
        self._owned(kernel_id)
        body = self.get_json_body() or {}
        try:
            answer = await self.drivers.start(kernel_id, body.get("line", ""))
        except ValueError as e:
            raise tornado.web.HTTPError(400, str(e)) from e
        self.finish(json.dumps(answer))


class ShutdownHandler(_Handler):
    @tornado.web.authenticated
    @authorized
    async def post(self, kernel_id: str):
        self._owned(kernel_id)
        answer = await self.drivers.shutdown(kernel_id)
        if answer is None:
            self._no_cluster(kernel_id)
        self.finish(json.dumps(answer))


class InterruptHandler(_Handler):
    @tornado.web.authenticated
    @authorized
    async def post(self, kernel_id: str):
        self._owned(kernel_id)
        await ensure_async(self.kernel_manager.interrupt_kernel(kernel_id))
        self.finish(json.dumps({"interrupted": kernel_id}))


def routes() -> list[tuple]:
    """The endpoints under ``nbrpc/`` (the server prefixes its base URL)."""
    return [
        ("nbrpc/clusters/?", ClustersHandler),
        (f"nbrpc/clusters/{KERNEL}/views/{VIEW}/?", ViewHandler),
        (f"nbrpc/clusters/{KERNEL}/start/?", StartHandler),
        (f"nbrpc/clusters/{KERNEL}/shutdown/?", ShutdownHandler),
        (f"nbrpc/clusters/{KERNEL}/interrupt/?", InterruptHandler),
    ]
