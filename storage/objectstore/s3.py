"""An S3 object store on boto3: any S3-compatible server (AWS S3, SeaweedFS, MinIO...).

Key ``a/b`` of the store ``s3://bucket/prefix`` is the object ``prefix/a/b`` of
``bucket``. How each ``ObjectStore`` operation maps to S3 requests (and is counted in
``stats``, one count per HTTP request the store issues; botocore's retries of a
request are not counted again):

==================  ==========================================================  =========
operation           S3 request                                                  counted
==================  ==========================================================  =========
``put``             ``PutObject``; from ``multipart_threshold`` bytes on, a      PUT x1, or
                    multipart upload (``upload_fileobj``: create, parts,         PUT x(parts+2)
                    complete; the object appears only at complete)
``put_if_absent``   ``PutObject`` with ``If-None-Match: *`` (atomic on AWS S3    PUT
                    since 2024 and on SeaweedFS); 412 -> ``ObjectExistsError``
``get``             ``GetObject``                                                GET
``get_range``       ``GetObject`` with ``Range: bytes=a-b``                      GET
``size/exists``     ``HeadObject``                                               HEAD
``list``            ``ListObjectsV2`` pages of ``list_page_size`` keys            LIST per page
``delete``          ``DeleteObject`` (idempotent)                                DELETE
``delete_many``     ``DeleteObjects`` per ``DELETE_BATCH`` (1,000) keys          DELETE per
                    (quiet mode: only failures are answered)                     batch
``copy``            ``CopyObject`` (server-side, up to 5 GiB; atomic; onto        COPY (HEAD
                    itself: only ``HeadObject``)                                 onto itself)
==================  ==========================================================  =========

``remove_abandoned_writes`` lists multipart uploads (LIST per page) and aborts the old
ones (DELETE each).

Configuration (explicit arguments win over the environment): endpoint from
``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (unset: AWS S3), region from
``AWS_REGION`` or ``AWS_DEFAULT_REGION`` (default ``us-east-1``), credentials by
botocore's default chain (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, profiles,
instance roles). Addressing is always path-style (``http://endpoint/bucket/key``),
which every S3-compatible server supports.

Retries: botocore's ``standard`` retry mode (``AWS_RETRY_MODE`` may pick ``adaptive``)
retries throttling, 5xx and connection errors with exponential backoff and jitter, up
to ``max_attempts`` attempts (``AWS_MAX_ATTEMPTS``, default 5); errors that retrying
cannot fix (403, 404, 412, bad request) fail at once. A request that still fails raises
``S3RequestError`` naming the operation and the object's ``s3://`` URI; missing or
refused credentials raise ``S3CredentialsError`` (not retryable) saying which settings
to check.

A store is cheap to reopen from its URI (``open_object_store(store.root_uri)``), which is
how Spark tasks get theirs: the executors need the same environment variables (on a
cluster, ``spark.executorEnv.AWS_...``). Clients are created once per configuration per
process and shared (boto3 clients are thread-safe; sessions are not).
"""
from __future__ import annotations

import io
import os
import threading
import time
from typing import Any
from urllib.parse import urlparse

from dkvstream.storage.errors import ObjectExistsError, ObjectNotFoundError, StorageError
from dkvstream.storage.objectstore import DELETE_BATCH, ObjectStore

DEFAULT_REGION = "us-east-1"
DEFAULT_MAX_ATTEMPTS = 5
MULTIPART_THRESHOLD = 64 * 1024 * 1024
MULTIPART_CHUNKSIZE = 16 * 1024 * 1024
LIST_PAGE_SIZE = 1000  # the S3 maximum
# HTTP codes S3 uses for "no such object" (HEAD has no error body, only the status).
_NOT_FOUND_CODES = {"NoSuchKey", "404", "NotFound"}
# AWS S3 answers 409 when two conditional writes of one key race; the loser is to retry
# (and then gets 412). botocore does not retry 409 by itself.
_CONDITIONAL_CONFLICT_CODES = {"ConditionalRequestConflict", "409"}
_CONDITIONAL_CONFLICT_RETRIES = 5


# S3 error codes of credentials that are missing, wrong or not allowed: retrying with
# the same ones cannot help, the user has to change them.
_CREDENTIAL_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken",
                     "InvalidToken", "TokenRefreshRequired", "403"}
CREDENTIALS_HINT = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary "
                    "credentials) or AWS_PROFILE in the environment, or pass access_key_id and "
                    "secret_access_key to S3ObjectStore")


class S3RequestError(StorageError):
    """Raised when an S3 request fails for good (after botocore's retries, or at once
    for permanent errors); the message names the operation, the object's URI and the
    cause (HTTP status and S3 error code, or the connection error).

    ``retryable``: True after transient failures (throttling, 5xx, timeouts, connection
    errors: botocore's retries ran out), False on an instance for other 4xx answers.
    """

    retryable = True


class S3CredentialsError(S3RequestError):
    """Raised when S3 has no credentials to sign with, or refuses them (HTTP 403:
    ``InvalidAccessKeyId``, ``SignatureDoesNotMatch``, ``AccessDenied``, an expired
    token); tried once, never retried; the message says which settings to check."""

    retryable = False


_clients: dict[tuple, Any] = {}
_clients_lock = threading.Lock()


def _shared_client(endpoint_url: str | None, region: str, access_key_id: str | None,
                   secret_access_key: str | None, session_token: str | None,
                   max_attempts: int | None, retry_mode: str | None,
                   connect_timeout_s: float, read_timeout_s: float):
    # Unset values fall back to AWS_RETRY_MODE / AWS_MAX_ATTEMPTS, then to ours.
    retry_mode = retry_mode or os.environ.get("AWS_RETRY_MODE") or "standard"
    max_attempts = max_attempts or int(os.environ.get("AWS_MAX_ATTEMPTS") or DEFAULT_MAX_ATTEMPTS)
    # Keyed by pid as well: a client's connection pool must not cross a fork (Spark's
    # Python workers are forked from a daemon).
    key = (os.getpid(), endpoint_url, region, access_key_id, secret_access_key, session_token,
           max_attempts, retry_mode, connect_timeout_s, read_timeout_s)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            import boto3
            from botocore.config import Config

            # botocore's "max_attempts" counts retries only; "total_max_attempts" counts
            # the first attempt too, like AWS_MAX_ATTEMPTS and our max_attempts.
            retries = {"mode": retry_mode, "total_max_attempts": max_attempts}
            config = Config(
                s3={"addressing_style": "path"}, retries=retries,
                connect_timeout=connect_timeout_s, read_timeout=read_timeout_s,
                max_pool_connections=32,
            )
            client = boto3.session.Session().client(
                "s3", endpoint_url=endpoint_url, region_name=region,
                aws_access_key_id=access_key_id, aws_secret_access_key=secret_access_key,
                aws_session_token=session_token, config=config)
            _clients[key] = client
        return client


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """Splits ``s3://bucket/prefix`` (or ``s3a://``) into ``(bucket, prefix)``.

    Raises:
        ValueError: not an s3 URI, or no bucket.
    """
    parsed = urlparse(uri)
    if parsed.scheme not in ("s3", "s3a") or not parsed.netloc:
        raise ValueError(f"not an s3://bucket/prefix URI: {uri!r}")
    return parsed.netloc, parsed.path.strip("/")


class S3ObjectStore(ObjectStore):
    """An ``ObjectStore`` in an S3 bucket, under a key prefix.

    Args:
        bucket: bucket name (it must exist).
        prefix: key prefix of the store's root (no leading/trailing ``/`` needed).
        endpoint_url: e.g. ``http://127.0.0.1:8333``; default from the environment
            (see module docstring), else AWS S3.
        region: signing region; default from the environment, else ``us-east-1``.
        access_key_id / secret_access_key / session_token: credentials; default
            botocore's chain.
        client: a ready boto3 S3 client to use instead of building one (e.g. from
            dagster-aws); the store then reopens elsewhere with the client's endpoint,
            region and credentials (see ``__reduce__``).
        max_attempts: total attempts per request, including the first (default
            ``AWS_MAX_ATTEMPTS`` or 5). retry_mode: ``standard`` (default) or ``adaptive``.
        multipart_threshold / multipart_chunksize: ``put`` of at least this many bytes
            uses a multipart upload of parts of this size (bytes; S3's minimum part is
            5 MiB).
        list_page_size: keys per ``ListObjectsV2`` page (1..1000).
        connect_timeout_s / read_timeout_s: socket timeouts per attempt, s.

    Raises:
        ValueError: bad bucket or sizes.
    """

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 region: str | None = None, access_key_id: str | None = None,
                 secret_access_key: str | None = None, session_token: str | None = None,
                 client: Any = None, max_attempts: int | None = None, retry_mode: str | None = None,
                 multipart_threshold: int = MULTIPART_THRESHOLD,
                 multipart_chunksize: int = MULTIPART_CHUNKSIZE,
                 list_page_size: int = LIST_PAGE_SIZE,
                 connect_timeout_s: float = 5.0, read_timeout_s: float = 60.0) -> None:
        super().__init__()
        if not bucket or "/" in bucket:
            raise ValueError(f"bad S3 bucket name {bucket!r}")
        if not 1 <= list_page_size <= 1000:
            raise ValueError(f"list_page_size must be in 1..1000, got {list_page_size}")
        if multipart_chunksize < 1 or multipart_threshold < 1:
            raise ValueError("multipart sizes must be positive")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._key_prefix = f"{self.prefix}/" if self.prefix else ""
        self.multipart_threshold = multipart_threshold
        self.multipart_chunksize = multipart_chunksize
        self.list_page_size = list_page_size
        if client is not None:
            creds = client._request_signer._credentials  # the identity the client signs as
            frozen = creds.get_frozen_credentials() if creds is not None else None
            endpoint_url = endpoint_url or client.meta.endpoint_url
            region = region or client.meta.region_name
            if frozen is not None and access_key_id is None:
                access_key_id, secret_access_key, session_token = frozen.access_key, frozen.secret_key, frozen.token
        else:
            endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION
        self.endpoint_url = endpoint_url or None
        self.region = region or DEFAULT_REGION
        # What a copy in another process needs to rebuild this store (see __reduce__).
        self._config = dict(
            endpoint_url=self.endpoint_url, region=self.region, access_key_id=access_key_id,
            secret_access_key=secret_access_key, session_token=session_token,
            max_attempts=max_attempts, retry_mode=retry_mode,
            multipart_threshold=multipart_threshold, multipart_chunksize=multipart_chunksize,
            list_page_size=list_page_size, connect_timeout_s=connect_timeout_s,
            read_timeout_s=read_timeout_s)
        self._client = client if client is not None else _shared_client(
            self.endpoint_url, self.region, access_key_id, secret_access_key, session_token,
            max_attempts, retry_mode, connect_timeout_s, read_timeout_s)

    # -------------------------------------------------------------- building
    @classmethod
    def from_uri(cls, uri: str, **kwargs: Any) -> S3ObjectStore:
        """The store rooted at ``s3://bucket/prefix``, configured from the environment
        (and ``kwargs``, the constructor's keyword arguments).

        Raises:
            ValueError: not an s3 URI.
        """
        bucket, prefix = parse_s3_uri(uri)
        return cls(bucket, prefix, **kwargs)

    @classmethod
    def from_s3_resource(cls, resource: Any, bucket: str, prefix: str = "", **kwargs: Any) -> S3ObjectStore:
        """The store for dagster-aws's ``S3Resource`` configuration.

        Builds its own path-style client from the resource's ``endpoint_url``,
        ``region_name``, ``aws_access_key_id``, ``aws_secret_access_key``,
        ``aws_session_token`` and ``max_attempts`` (unset fields fall back to the
        environment, as boto3 would), so the store pickles and reopens in Spark tasks.

        Args:
            resource: a ``dagster_aws.s3.S3Resource`` (any object with those attributes).
            bucket / prefix / kwargs: as for the constructor.
        """
        def field(name: str):
            value = getattr(resource, name, None)
            return value if value else None

        if field("profile_name"):
            # A profile names credentials in ~/.aws; take them from the resource's client.
            return cls(bucket, prefix, client=resource.get_client(), **kwargs)
        kwargs.setdefault("max_attempts", field("max_attempts"))
        return cls(bucket, prefix, endpoint_url=field("endpoint_url"), region=field("region_name"),
                   access_key_id=field("aws_access_key_id"),
                   secret_access_key=field("aws_secret_access_key"),
                   session_token=field("aws_session_token"), **kwargs)

    def __reduce__(self):
        # Rebuilt from its configuration in the other process (a boto3 client does not
        # pickle); stats start fresh there, as for LocalObjectStore.
        return (_reopen, (self.bucket, self.prefix, self._config))

    def __repr__(self) -> str:
        return f"S3ObjectStore({self.root_uri!r}, endpoint_url={self.endpoint_url!r})"

    @property
    def client(self):
        """The boto3 S3 client this store uses."""
        return self._client

    # ---------------------------------------------------------------- naming
    @property
    def root_uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._object_key(key)}"

    def _object_key(self, key: str) -> str:
        # Same guard as the local store: keys come from our own naming code.
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"invalid object key {key!r}")
        return self._key_prefix + key

    def _call(self, operation: str, key: str, fn, *args, **kwargs):
        """Runs one boto3 call, translating its errors (see ``S3RequestError``)."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

        try:
            return fn(*args, **kwargs)
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            if code in _NOT_FOUND_CODES:
                raise ObjectNotFoundError(f"object not found: {self.uri(key) if key else self.root_uri}") from None
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            failed = (f"S3 {operation} {self.uri(key) if key else self.root_uri + '/'} failed: HTTP {status} "
                      f"{code}: {e.response.get('Error', {}).get('Message', '')} (endpoint {self._endpoint_name()})")
            if code in _CREDENTIAL_CODES or status == 403:
                raise S3CredentialsError(f"{failed}; the credentials were refused: check them and the "
                                         f"bucket's permissions ({CREDENTIALS_HINT})") from e
            error = S3RequestError(failed)
            # botocore retried 5xx and throttling already; any other answer is final.
            error.retryable = not isinstance(status, int) or status >= 500 or status == 429
            raise error from e
        except (NoCredentialsError, PartialCredentialsError) as e:
            raise S3CredentialsError(
                f"S3 {operation} {self.uri(key) if key else self.root_uri + '/'}: no credentials to sign "
                f"with ({e}); {CREDENTIALS_HINT}") from e
        except BotoCoreError as e:
            attempts = self._client.meta.config.retries.get("total_max_attempts", "?")
            raise S3RequestError(
                f"S3 {operation} {self.uri(key) if key else self.root_uri + '/'} failed after "
                f"{attempts} attempts: {e}") from e

    def _endpoint_name(self) -> str:
        return self.endpoint_url or "AWS S3"

    # ---------------------------------------------------------------- writes
    def put(self, key: str, data: bytes) -> None:
        object_key = self._object_key(key)
        if len(data) < self.multipart_threshold:
            self.stats.record("PUT", bytes_written=len(data))
            self._call("PutObject", key, self._client.put_object,
                       Bucket=self.bucket, Key=object_key, Body=data)
            return
        from boto3.s3.transfer import TransferConfig
        from s3transfer.utils import ChunksizeAdjuster

        chunk = ChunksizeAdjuster().adjust_chunksize(self.multipart_chunksize, len(data))
        parts = -(-len(data) // chunk)
        config = TransferConfig(multipart_threshold=self.multipart_threshold, multipart_chunksize=chunk,
                                max_concurrency=4)
        self.stats.record("PUT", bytes_written=len(data))  # CreateMultipartUpload + payload
        for _ in range(parts + 1):  # UploadPart x parts, CompleteMultipartUpload
            self.stats.record("PUT")
        self._call("multipart upload", key, self._client.upload_fileobj,
                   io.BytesIO(data), self.bucket, object_key, Config=config)

    def put_if_absent(self, key: str, data: bytes) -> None:
        """Atomic create (``If-None-Match: *``); a single ``PutObject`` whatever the size
        (5 GiB at most), since conditional multipart completion is not supported by every
        server. Manifests, its only users, are small.

        A retried request whose first attempt did succeed (the answer was lost) gets 412
        from the retry; the store then reads the object back and treats identical bytes
        as its own write.
        """
        object_key = self._object_key(key)
        for conflict in range(_CONDITIONAL_CONFLICT_RETRIES + 1):
            from botocore.exceptions import ClientError

            self.stats.record("PUT", bytes_written=len(data))
            try:
                self._client.put_object(Bucket=self.bucket, Key=object_key, Body=data, IfNoneMatch="*")
                return
            except ClientError as e:
                code = str(e.response.get("Error", {}).get("Code", ""))
                status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if code == "PreconditionFailed" or status == 412:
                    retried = e.response.get("ResponseMetadata", {}).get("RetryAttempts", 0) > 0
                    if retried and self._holds(key, data):
                        return
                    raise ObjectExistsError(f"object already exists: {self.uri(key)}") from None
                if (code in _CONDITIONAL_CONFLICT_CODES or status == 409) and conflict < _CONDITIONAL_CONFLICT_RETRIES:
                    time.sleep(0.05 * 2 ** conflict)
                    continue
                self._call("PutObject(If-None-Match)", key, _reraise, e)
            except Exception as e:  # noqa: BLE001 - connection errors: translated below
                self._call("PutObject(If-None-Match)", key, _reraise, e)

    def _holds(self, key: str, data: bytes) -> bool:
        try:
            return self.get(key) == data
        except ObjectNotFoundError:
            return False

    # ----------------------------------------------------------------- reads
    def get(self, key: str) -> bytes:
        object_key = self._object_key(key)
        try:
            response = self._call("GetObject", key, self._client.get_object, Bucket=self.bucket, Key=object_key)
            data = self._call("GetObject", key, response["Body"].read)
        except BaseException:
            self.stats.record("GET")
            raise
        self.stats.record("GET", bytes_read=len(data))
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        from botocore.exceptions import ClientError

        if start < 0 or length < 0:
            raise ValueError(f"bad range start={start} length={length} for {self.uri(key)}")
        object_key = self._object_key(key)
        # A zero-length read still asks for one byte: it must fail on a missing key.
        last = start + max(length, 1) - 1
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=object_key, Range=f"bytes={start}-{last}")
            data = self._call("GetObject(Range)", key, response["Body"].read)
        except ClientError as e:
            self.stats.record("GET")
            if e.response.get("Error", {}).get("Code") == "InvalidRange":  # start at or past the end
                return b""
            self._call("GetObject(Range)", key, _reraise, e)
        except BaseException as e:
            self.stats.record("GET")
            self._call("GetObject(Range)", key, _reraise, e)
        data = data[:length]
        self.stats.record("GET", bytes_read=len(data))
        return data

    def size(self, key: str) -> int:
        object_key = self._object_key(key)
        self.stats.record("HEAD")
        response = self._call("HeadObject", key, self._client.head_object, Bucket=self.bucket, Key=object_key)
        return int(response["ContentLength"])

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except ObjectNotFoundError:
            return False
        return True

    def list(self, prefix: str) -> list[str]:
        if prefix.startswith("/"):
            raise ValueError(f"invalid list prefix {prefix!r}")
        full = self._key_prefix + prefix
        strip = len(self._key_prefix)
        keys: list[str] = []
        token = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full, "MaxKeys": self.list_page_size}
            if token:
                kwargs["ContinuationToken"] = token
            self.stats.record("LIST")
            page = self._call("ListObjectsV2", prefix, self._client.list_objects_v2, **kwargs)
            keys.extend(obj["Key"][strip:] for obj in page.get("Contents", ()))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                break
        keys.sort()  # S3 lists in UTF-8 byte order already; servers that do not are fixed here
        return keys

    def remove_abandoned_writes(self, prefix: str, older_than_s: float) -> int:
        """Aborts multipart uploads under ``prefix`` initiated more than ``older_than_s``
        seconds ago: a ``put`` killed between create and complete leaves one, whose
        parts the bucket stores (and bills) until aborted. Counted as LIST per page of
        ``ListMultipartUploads`` and DELETE per abort. Returns how many were aborted."""
        full = self._key_prefix + prefix
        cutoff = time.time() - older_than_s
        aborted = 0
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full}
        while True:
            self.stats.record("LIST")
            page = self._call("ListMultipartUploads", prefix, self._client.list_multipart_uploads, **kwargs)
            for upload in page.get("Uploads", ()):
                if upload["Initiated"].timestamp() < cutoff:
                    self.stats.record("DELETE")
                    self._call("AbortMultipartUpload", upload["Key"][len(self._key_prefix):],
                               self._client.abort_multipart_upload, Bucket=self.bucket, Key=upload["Key"],
                               UploadId=upload["UploadId"])
                    aborted += 1
            if not page.get("IsTruncated"):
                return aborted
            kwargs.update(KeyMarker=page.get("NextKeyMarker", ""), UploadIdMarker=page.get("NextUploadIdMarker", ""))

    def delete(self, key: str) -> None:
        object_key = self._object_key(key)
        self.stats.record("DELETE")
        self._call("DeleteObject", key, self._client.delete_object, Bucket=self.bucket, Key=object_key)

    def delete_many(self, keys: list[str]) -> None:
        for start in range(0, len(keys), DELETE_BATCH):
            batch = keys[start:start + DELETE_BATCH]
            objects = [{"Key": self._object_key(k)} for k in batch]
            self.stats.record("DELETE")
            response = self._call("DeleteObjects", batch[0], self._client.delete_objects,
                                  Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True})
            # DeleteObjects answers 200 even when some keys failed; a missing key is a
            # success (S3 deletes are idempotent), anything else is reported.
            errors = response.get("Errors") or []
            if errors:
                first = errors[0]
                raise S3RequestError(
                    f"S3 DeleteObjects failed for {len(errors)} of {len(batch)} keys, first "
                    f"s3://{self.bucket}/{first.get('Key')}: {first.get('Code')} {first.get('Message', '')} "
                    f"(endpoint {self._endpoint_name()}); deleting again is safe")

    def copy(self, src_key: str, dst_key: str) -> None:
        if src_key == dst_key:  # S3 refuses a copy onto itself; there is nothing to do
            if not self.exists(src_key):
                raise ObjectNotFoundError(f"object not found: {self.uri(src_key)}")
            return
        source = {"Bucket": self.bucket, "Key": self._object_key(src_key)}
        self.stats.record("COPY")
        self._call("CopyObject", src_key, self._client.copy_object, Bucket=self.bucket,
                   Key=self._object_key(dst_key), CopySource=source)


def _reraise(e: BaseException):
    raise e


def _reopen(bucket: str, prefix: str, config: dict) -> S3ObjectStore:
    return S3ObjectStore(bucket, prefix, **config)
