"""What a reader process loads: a training script, a DataLoader worker, the CLI, through
`avafs/client.py`.

The control socket's wire format and a client's end of it (`control_socket.py`), the table of
files' block locations a reader may keep (`known_locations.py`) and the dataset manifest
(`manifest.py`). This layer sits below everything the daemon runs (tests/docs/test_layers.py), so
a reader process never imports the data path, and the daemon's modules that share these
formats import them from here.
"""
