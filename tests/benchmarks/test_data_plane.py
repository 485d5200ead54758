"""The link benchmark's nginx data plane (``benchmarks/data_plane.py``) serves the s3:// and
gs:// readers what the moto server and the GCS emulator behind it serve: the same samples,
ranges, HEADs, ETag checks, listings and missing keys, with each link's cap and first-byte
delay. Skipped where nginx or its echo module is not installed (``apt-get install nginx
libnginx-mod-http-echo``)."""

from __future__ import annotations

import time
import urllib.parse

import pytest

from benchmarks.data_plane import NginxPlane, missing
from tests.support.servers import environ
from tests.support.shard_data import write_dataset

MISSING = missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"nginx data plane: {MISSING}")

COUNTS = [7, 5]
RATE, DELAY = 4e6, 0.08  # a link slow enough to time in a test


@pytest.fixture
def plane(tmp_path, s3, s3_bucket, gcs):
    """A small dataset in moto, in the GCS emulator and in the plane's folder, and the plane
    in front of both, with one shaped link."""
    folder = tmp_path / "data"
    write_dataset(folder, COUNTS, payload=300_000)
    s3.upload(folder, s3_bucket, "p")
    for path in sorted(folder.iterdir()):
        upload_to_gcs(gcs, f"p/{path.name}", path.read_bytes())
    with NginxPlane(tmp_path / "root", s3.port, gcs.port, links=[(RATE, DELAY)]) as served:
        served.mirror(folder, s3_bucket, "p")
        served.mirror(folder, gcs.bucket, "p")
        yield served, folder, s3_bucket


def upload_to_gcs(gcs, name: str, data: bytes) -> None:
    import urllib3

    query = urllib.parse.urlencode({"uploadType": "media", "name": name})
    response = urllib3.PoolManager().request(
        "POST", f"{gcs.endpoint}/upload/storage/v1/b/{gcs.bucket}/o?{query}", body=data)
    assert response.status == 200, response.data


def samples(source: str) -> list[tuple[str, bytes, bytes]]:
    import wdstream

    dataset = wdstream.StreamingDataset(source, shuffle=False, decode=False)
    return [(s["__key__"], s["json"], s["txt"]) for s in dataset]


@pytest.mark.slow
def test_the_s3_reader_streams_through_the_plane_as_from_moto(plane, s3):
    from wdstream.sources.objects import list_files

    served, _folder, bucket = plane
    url = f"s3://{bucket}/p/"
    from_moto = samples(url)
    listed = list_files(url)
    assert len(from_moto) == sum(COUNTS)
    for link in (None, 0):
        with environ({"AWS_ENDPOINT_URL": served.endpoint("s3", link)}):
            assert samples(url) == from_moto
            assert list_files(url) == listed  # the listing is moto's, through nginx


@pytest.mark.slow
def test_ranges_heads_etags_and_missing_keys_through_the_plane(plane):
    from wdstream.errors import StreamError
    from wdstream.sources.range_fetchers import HttpStatusError, ObjectChanged, PastEnd
    from wdstream.sources.s3_objects import head, head_size
    from wdstream.sources.s3_ranges import S3Ranges

    served, folder, bucket = plane
    data = (folder / "shard-000000.tar").read_bytes()
    url = f"s3://{bucket}/p/shard-000000.tar"
    with environ({"AWS_ENDPOINT_URL": served.endpoint("s3", None)}):
        fetcher = S3Ranges(url, 10.0)
        fetcher.connect()
        response = fetcher.get(1000, 1999, None)  # a presigned URL: its query is ignored
        body = bytearray(1000)
        assert response.readinto(memoryview(body)) == 1000
        response.close()
        assert (response.partial, response.first, response.size) == (True, 1000, len(data))
        assert bytes(body) == data[1000:2000]
        etag = response.version
        stat = (folder / "shard-000000.tar").stat()
        assert etag == f'"{int(stat.st_mtime):x}-{stat.st_size:x}"'  # nginx's, of the file
        assert head(url) == {"size": len(data), "ETag": etag}
        fetcher.get(0, 9, etag).close()  # If-Match on the ETag the first response gave
        with pytest.raises(ObjectChanged):
            fetcher.get(0, 9, '"another-version"')
        with pytest.raises(PastEnd) as past:
            fetcher.get(len(data) + 10, None, etag)
        assert past.value.size == len(data)
        missing_url = f"s3://{bucket}/p/no-such-shard.tar"
        assert head_size(missing_url) is None
        absent = S3Ranges(missing_url, 10.0)
        absent.connect()
        with pytest.raises(HttpStatusError, match="NoSuchKey"):  # moto's answer, through nginx
            absent.get(0, 9, None)
        with pytest.raises(StreamError, match="no-such-shard"):
            samples(f"s3://{bucket}/p/no-such-shard.tar")


def test_the_gcs_reader_reads_the_files_through_the_plane(plane, gcs):
    import urllib3

    served, folder, _bucket = plane
    url = f"gs://{gcs.bucket}/p/"
    from_emulator = samples(url)
    with environ({"STORAGE_EMULATOR_HOST": served.endpoint("gs", None)}):
        assert samples(url) == from_emulator
    media = (f"{served.endpoint('gs', None)}/download/storage/v1/b/{gcs.bucket}/o/"
             "p%2Fshard-000001.tar?alt=media")
    response = urllib3.PoolManager().request("GET", media, headers={"Range": "bytes=3-12"})
    assert response.status == 206
    assert response.data == (folder / "shard-000001.tar").read_bytes()[3:13]
    assert response.headers.get("ETag")  # nginx's file, not the emulator's answer


def test_a_shaped_link_caps_each_connection_and_delays_its_first_byte(plane):
    import urllib3

    served, folder, bucket = plane
    size = (folder / "shard-000000.tar").stat().st_size
    least = DELAY + 0.7 * size / RATE  # the link's slowest share of a cap and its delay
    pool = urllib3.PoolManager()
    timings = {}
    for link in (0, None):
        started = time.perf_counter()
        response = pool.request("GET", f"{served.endpoint('s3', link)}/{bucket}/p/"
                                "shard-000000.tar", preload_content=False)
        response.read(1)
        first_byte = time.perf_counter() - started
        assert len(response.read()) + 1 == size
        timings[link] = first_byte, time.perf_counter() - started
    assert timings[0][0] >= DELAY and timings[0][1] >= least
    assert timings[None][1] < least  # loopback: neither held nor capped


def test_a_plane_that_cannot_start_says_why(tmp_path):
    with pytest.raises(ValueError, match="rate must be positive"):
        NginxPlane(tmp_path, 1, links=[(0, 0.01)])


@pytest.mark.slow
def test_an_etag_of_the_store_behind_is_served_unchecked_any_other_refused(plane, s3):
    from wdstream.sources.range_fetchers import ObjectChanged
    from wdstream.sources.s3_ranges import S3Ranges

    served, folder, bucket = plane
    data = (folder / "shard-000000.tar").read_bytes()
    url = f"s3://{bucket}/p/shard-000000.tar"
    listed = s3.client().head_object(Bucket=bucket, Key="p/shard-000000.tar")["ETag"]
    for link in (None, 0):  # unshaped, and held before it is served
        with environ({"AWS_ENDPOINT_URL": served.endpoint("s3", link)}):
            fetcher = S3Ranges(url, 10.0)
            fetcher.connect()
            response = fetcher.get(100, 199, listed)  # moto's ETag, as a plan has it
            body = bytearray(100)
            assert response.readinto(memoryview(body)) == 100 and bytes(body) == data[100:200]
            response.close()
            assert response.version == listed
            with pytest.raises(ObjectChanged):
                fetcher.get(0, 9, '"0123456789abcdef0123456789abcdeX"')
