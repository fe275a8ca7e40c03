"""MTL users: the credentials file (``peermesh.mtl.users``), SASL exchanges against it
(``peermesh.mtl.sasl``) and failed-attempt throttling (``peermesh.mtl.throttle``),
gathered under one name."""

from __future__ import annotations

from .sasl import Authenticator, SaslExchange, SaslStep
from .throttle import FailureTable, Throttle
from .users import (DEFAULT_ITERATIONS, MAX_FILE_BYTES, MAX_ITERATIONS, MECHANISMS, MIN_ITERATIONS,
                    CredentialsError, CredentialsFile, User, Verifier, check_name,
                    default_credentials_path, default_data_dir, dump_credentials, format_time,
                    make_user, parse_credentials, parse_time)

__all__ = ["CredentialsError", "Verifier", "User", "CredentialsFile", "make_user",
           "check_name", "parse_credentials", "dump_credentials", "parse_time", "format_time",
           "Authenticator", "SaslExchange", "SaslStep", "Throttle", "FailureTable",
           "default_credentials_path", "default_data_dir", "DEFAULT_ITERATIONS", "MIN_ITERATIONS",
           "MAX_ITERATIONS", "MECHANISMS", "MAX_FILE_BYTES"]
