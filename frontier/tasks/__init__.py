"""The `fab` task namespace, assembled from one module per area.

Tasks are thin: they parse options, load the stack, call into the library and print tables.
"""

from invoke import Collection

from frontier.tasks import config_tasks, local_tasks, ops_tasks

namespace = Collection()
for module in (config_tasks, ops_tasks, local_tasks):
    module.register(namespace)
