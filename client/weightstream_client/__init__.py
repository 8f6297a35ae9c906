"""weightstream_client: submit and follow jobs on a weightstream appliance.

The REST client and the ``wsctl`` CLI arrive with the appliance's job service (issue 4); this
distribution is kept separate and light so a user's machine never installs server code.
"""

__version__ = "0.1.0"
