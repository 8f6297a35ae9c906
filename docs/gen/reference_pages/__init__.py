"""The reference pages of the documentation site, rendered from the code's own definitions.

Each module renders one page from what the code declares (the click command trees, the params schema,
the REST API's OpenAPI document, the Prometheus registry) as a pure function returning markdown, so
``docs/gen/reference.py`` only writes the strings and the tests read the same strings.
"""
