"""`deny-list`: a berth lifecycle hook written in Python (componentize-py), against the
same WIT as the Rust hooks (berth:hook/hook@0.1.0).

A policy hook: it refuses a task whose driver, command or image is on the operator's
deny-list, with a reason the user sees in `berth alloc status`. Its config:

    config = {
      deny_drivers  = "raw_exec"
      deny_commands = "/usr/bin/curl,/usr/bin/wget"
      deny_images   = "busybox:latest"
    }

Build it:

    componentize-py -d wit/host -d wit/hook -w berth:hook/hook@0.1.0 \
        componentize --python-path examples/hooks/py-deny-list app -o deny_list.wasm
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports import types


def _listed(config, key):
    for name, value in config:
        if name == key:
            return [item.strip() for item in value.split(",") if item.strip()]
    return []


class Lifecycle(exports.Lifecycle):
    def prestart(self, context: types.TaskContext) -> types.PrestartResponse:
        config = context.hook_config
        if context.driver in _listed(config, "deny_drivers"):
            raise Err(
                f"policy: task {context.task_name!r} may not use driver {context.driver!r} on this node"
            )
        try:
            task_config = json.loads(context.task_config)
        except ValueError:
            task_config = {}
        command = str(task_config.get("command", ""))
        if command and command in _listed(config, "deny_commands"):
            raise Err(f"policy: command {command!r} is on this node's deny-list")
        image = str(task_config.get("image", ""))
        if image and image in _listed(config, "deny_images"):
            raise Err(f"policy: image {image!r} is on this node's deny-list")
        return types.PrestartResponse(
            env=[],
            files=[],
            events=[f"policy: task {context.task_name!r} allowed"],
        )

    def poststart(self, context: types.TaskContext) -> None:
        pass

    def exited(self, context: types.TaskContext, exit: types.ExitInfo) -> None:
        pass

    def stop(self, context: types.TaskContext) -> None:
        pass
