"""A real S3-compatible HTTP server in this process (moto's ThreadedMotoServer) on a free
port, which a test can stop (connections refused) and start again on the same port with
the same buckets and objects (moto keeps them in the process)."""

from __future__ import annotations

import uuid
from typing import Any

import boto3
from botocore.config import Config
from moto.server import ThreadedMotoServer

ACCESS_KEY_ID = "cloister-test-key"
SECRET_ACCESS_KEY = "cloister-test-secret-do-not-log"
REGION = "us-east-1"


class MotoS3:
    """One moto server and a boto3 client on it; `settings()` points a gateway at it."""

    def __init__(self) -> None:
        self.port = 0
        self._server: ThreadedMotoServer | None = None
        self.start()
        self.bucket = f"cloister-{uuid.uuid4().hex[:12]}"  # moto's state is per process
        self.client().create_bucket(Bucket=self.bucket)

    @property
    def endpoint_url(self) -> str:
        """The server's URL."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Serves (again) on the same port, or a free one the first time."""
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        server.start()
        self.port = server.get_host_and_port()[1]
        self._server = server

    def stop(self) -> None:
        """Stops serving and closes the listening socket: connections are refused."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()
            inner = server._server
            if inner is not None:
                inner.server_close()

    def client(self) -> Any:
        """A boto3 S3 client on the server, to look at what the gateway stored."""
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY_ID,
            aws_secret_access_key=SECRET_ACCESS_KEY,
            config=Config(s3={"addressing_style": "path"}),
        )

    def keys(self) -> set[str]:
        """Every object key in the bucket."""
        listing = self.client().list_objects_v2(Bucket=self.bucket)
        return {item["Key"] for item in listing.get("Contents", [])}

    def body(self, key: str) -> bytes:
        """One object's bytes."""
        data: bytes = self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return data

    def settings(self, **overrides: Any) -> dict[str, Any]:
        """Settings overrides that keep a gateway's files in this bucket."""
        values: dict[str, Any] = {
            "files_s3_bucket": self.bucket,
            "files_s3_endpoint_url": self.endpoint_url,
            "files_s3_region": REGION,
            "files_s3_prefix": "tenants-files",
            "files_s3_access_key_id": ACCESS_KEY_ID,
            "files_s3_secret_access_key": SECRET_ACCESS_KEY,
            "files_s3_timeout_s": 2.0,
        }
        values.update(overrides)
        return values
