"""Training adapters: PyTorch and TensorFlow datasets over avafs mounts.

The package root imports nothing heavy on purpose: `adapters.torch` pulls in torch and
`adapters.tf` pulls in TensorFlow, and a job should pay only for the framework it trains with.
The coordinator (`adapters.sharding`) needs neither, so it can run as a small service anywhere.
"""
