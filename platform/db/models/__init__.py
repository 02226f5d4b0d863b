"""The control plane's tables, as typed SQLAlchemy 2.0 models, one module per domain: accounts
(tenants, API keys), adapters (the registry), logs (usage, audit), training, blobs, limits.

Importing the package registers every table on Base.metadata, which the migrations compare against
(migrations/env.py); callers import the names from here. Any change to a table needs a new Alembic
revision in migrations/versions; the test suite fails while the models and the migrated schema differ.
"""
from loraloom.platform.db.models.accounts import ApiKey, ApiKeyRole, Tenant
from loraloom.platform.db.models.adapters import (
    MAX_DECLARED_BASE_CHARS,
    MUTABLE_VERSION_COLUMNS,
    Adapter,
    AdapterVersion,
    AdapterVersionFile,
    AdapterVersionSource,
    AdapterVersionStatus,
    Alias,
    AliasAction,
    AliasHistory,
    AliasSplit,
)
from loraloom.platform.db.models.base import (
    MAX_INT64,
    NAMING_CONVENTION,
    Base,
    BigIntId,
    JSONDocument,
    UTCDateTime,
    utcnow,
)
from loraloom.platform.db.models.blobs import BlobClaim, BlobLock
from loraloom.platform.db.models.limits import PER_MINUTE_AND_CONCURRENT, ApiKeyLimits, TenantLimits
from loraloom.platform.db.models.logs import AuditLogEntry, UsageRecord, UsageStatus
from loraloom.platform.db.models.training import (
    FineTuningCheckpoint,
    FineTuningJob,
    FineTuningJobEvent,
    FineTuningJobStatus,
    TrainingFile,
    TrainingThroughput,
)

__all__ = [
    "MAX_DECLARED_BASE_CHARS", "MAX_INT64", "MUTABLE_VERSION_COLUMNS", "NAMING_CONVENTION", "PER_MINUTE_AND_CONCURRENT",
    "Adapter", "AdapterVersion", "AdapterVersionFile", "AdapterVersionSource", "AdapterVersionStatus", "Alias",
    "AliasAction", "AliasHistory", "AliasSplit", "ApiKey", "ApiKeyLimits", "ApiKeyRole", "AuditLogEntry", "Base",
    "BigIntId", "BlobClaim",
    "BlobLock", "FineTuningCheckpoint", "FineTuningJob", "FineTuningJobEvent", "FineTuningJobStatus", "JSONDocument",
    "Tenant", "TenantLimits", "TrainingFile", "TrainingThroughput", "UTCDateTime", "UsageRecord", "UsageStatus", "utcnow",
]
