"""The OpenAI Batch API: tenant files (`/v1/files`) and batches (`/v1/batches`).

A batch is a JSONL file of requests. Each line runs as an ordinary request of the
tenant through the gateway's own routes (so it is authorized, validated, served in the
tenant's cache domain and metered exactly like an interactive one), in the engine's
batch traffic class, and its result is stored before the line counts as done, so a
restarted server resumes a batch without running a line twice or losing one.

    tables       the database rows: files, batches, line results
    file_store   file metadata in the database, bytes in a blob store
    blob_store   the blob store protocol and the data directory's (<data_dir>/files)
    s3_blob_store  bytes in an S3-compatible bucket (boto3), when one is configured
    blob_factory   the store the settings name, checked at start
    file_upload  a multipart upload streamed to disk under size and line caps
    content_stream  a file's bytes streamed to the client from its store
    batch_lines  one input line: parsed and checked against the batch's endpoint
    batch_store  batches: create, read, cancel, progress, results, finalize
    line_call    one line sent through the gateway app in-process
    runner       the background worker that runs every tenant's batches
"""
