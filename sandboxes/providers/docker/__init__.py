"""The `docker` provider: hardened containers driven by the in-sandbox agent.

The only package in Sandpit that imports `docker`: everything the rest of the project
sees is a dataclass or error from `base`. Modules: provider (DockerProvider: configuration,
Engine client, lifecycle), container (what a sandbox container is: paths, runtimes,
limits), create (the create path), operations (the agent connection and what goes over
it), errors (the one translation of Engine errors), relay (an agent connection over
`docker exec`), sessions (file watches); engines (DockerEngines, what
get_provider("docker") returns: one DockerProvider per engine of SANDPIT_DOCKER_HOSTS,
placement and routing), engine_config (that setting's format), routed (the operations
sent to a sandbox's engine).
"""

from .container import CONTAINER, GVISOR, GVISOR_NETWORK_RUNTIME, isolation_of
from .provider import DockerProvider
from .sessions import DockerWatch

__all__ = [
    "CONTAINER",
    "GVISOR",
    "GVISOR_NETWORK_RUNTIME",
    "DockerProvider",
    "DockerWatch",
    "isolation_of",
]
