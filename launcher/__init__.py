"""The top floor: the ``heraldps`` command line and the local-cluster launcher.

Imports run one way: the common package (``heraldps``) <- the services
(``ps_server``, ``scheduler_service``, ``worker_client``) <- this package. Only
this package may import several services; none of them imports it.
"""
