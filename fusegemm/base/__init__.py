"""Leaves of fusegemm: facts every layer may read, importing nothing from the layers.

``errors`` (the exception types), ``package`` (version and package data folders), ``dtypes``
(the one dtype table), ``archs`` (the one arch table) and ``contract`` (the host<->device launch
contract every kernel exports). generator/, runtime/ and the public API import these; these import
nothing from them (tests/unit/test_layers.py checks it).
"""
