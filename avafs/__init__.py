"""avafs: object-storage buckets as one cached local directory tree for training jobs."""

__version__ = "0.1.0"
