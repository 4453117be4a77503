"""The package's version, in one place: ``twinkle_fx.__version__`` and the record of which code ran
(:func:`twinkle_fx.measure.environment.describe_environment`) both read it."""

__all__ = ["VERSION"]

VERSION = "0.1.0"
