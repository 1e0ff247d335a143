//! Images in an S3 bucket end to end, against moto's real S3 server on
//! 127.0.0.1 (from the venv `scripts/test.sh` creates; the tests fail
//! without it): `verityfs publish SRC s3://BUCKET/PREFIX`, then `verityfs
//! mount s3://BUCKET/PREFIX --digest` (real FUSE mounts, the store's
//! settings in the daemon's environment). The mount must serve the source
//! tree byte for byte with its fs-verity digests; a second publish must
//! keep the objects already there; a wrong digest or a damaged object in
//! the bucket must be refused; a disk cache must serve what it holds with
//! the server gone.

mod common;

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::images::*;
use common::*;
use verityfs_testnet::{Faults, Moto, Proxy};

/// The big file's size: more than one 8 MiB part of a multipart upload,
/// and not a multiple of the block size.
const BIG_SIZE: usize = 9_000_000;
/// The bucket of every test (each test has its own server).
const BUCKET: &str = "bucket";
/// Where in the bucket the image is.
const PREFIX: &str = "some/prefix";

/// A source tree published to a bucket of a private moto server.
struct S3Image {
    /// `None` once stopped.
    moto: Option<Moto>,
    dir: tempfile::TempDir,
    src: PathBuf,
    /// `s3://BUCKET/PREFIX`.
    url: String,
    /// The digest `verityfs publish` printed.
    digest: String,
}

impl S3Image {
    /// Starts moto, creates the bucket and publishes the test tree to it.
    fn publish() -> S3Image {
        prerequisites();
        let moto = Moto::start().unwrap_or_else(|e| panic!("moto's S3 server: {e}"));
        moto.create_bucket(BUCKET).unwrap();
        let dir = tempfile::Builder::new()
            .prefix("verityfs-s3-test")
            .tempdir()
            .unwrap();
        let src = dir.path().canonicalize().unwrap().join("src");
        make_tree(&src, BIG_SIZE);
        let mut image = S3Image {
            moto: Some(moto),
            dir,
            src,
            url: format!("s3://{BUCKET}/{PREFIX}"),
            digest: String::new(),
        };
        let started = Instant::now();
        image.digest = image.publish_with(&image.env());
        println!(
            "published {} MB to moto in {:?}",
            BIG_SIZE / 1_000_000,
            started.elapsed()
        );
        image
    }

    /// The S3 server.
    fn moto(&self) -> &Moto {
        self.moto.as_ref().expect("the server is running")
    }

    /// Stops the S3 server for good.
    fn stop_server(&mut self) {
        self.moto = None;
    }

    /// The environment of the commands: moto's settings, and a private
    /// `TMPDIR` for `publish`'s staging directory.
    fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = self.moto().env().to_vec();
        env.push(("TMPDIR", self.tmp().to_str().unwrap().to_owned()));
        env
    }

    /// The private `TMPDIR`, created if missing.
    fn tmp(&self) -> PathBuf {
        let tmp = self.dir.path().join("tmp");
        fs::create_dir_all(&tmp).unwrap();
        tmp
    }

    /// Publishes the tree to the bucket with `env`; checks that the
    /// staging directory is gone.
    fn publish_with(&self, env: &[(&str, String)]) -> String {
        let digest = publish(&self.src, OsStr::new(&self.url), env);
        assert_no_staging_left(&self.tmp());
        digest
    }

    /// The image the tree gives in a local directory: the same objects
    /// (content addressed) and the same manifest as in the bucket.
    fn local_image(&self) -> PathBuf {
        let image = self.dir.path().join("local-image");
        if !image.exists() {
            let digest = publish(&self.src, image.as_os_str(), &[]);
            assert_eq!(digest, self.digest, "a bucket or a directory: one digest");
        }
        image
    }

    /// Mounts the image with its digest, `env` and `args`.
    fn mount_with(&self, env: &[(&str, String)], args: &[&str]) -> Mount {
        let digest = format!("--digest={}", self.digest);
        Mount::with_env(Path::new(&self.url), env, &prepend(&digest, args))
    }

    /// Runs `verityfs mount URL MNT ARGS`, which must exit (bounded).
    fn try_mount(&self, mnt: &Path, args: &[&str]) -> Output {
        run(Command::new(VERITYFS)
            .arg("mount")
            .arg(&self.url)
            .arg(mnt)
            .args(args)
            .envs(self.env()))
    }

    /// The key of the object holding the contents of source file `name`,
    /// and its path in the local image.
    fn object_of(&self, name: &str) -> (String, PathBuf) {
        let digest = digest(&self.src.join(name), &[]);
        let name = format!("objects/sha256-{}", digest.strip_prefix("sha256:").unwrap());
        (format!("{PREFIX}/{name}"), self.local_image().join(name))
    }
}

/// `first`, then `rest`.
fn prepend<'a>(first: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    [first].into_iter().chain(rest.iter().copied()).collect()
}

/// Fails if `tmp` holds anything (a staging directory left behind).
fn assert_no_staging_left(tmp: &Path) {
    let left: Vec<_> = fs::read_dir(tmp)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Every regular file of `mnt` has the bytes of its source in `src`.
fn assert_same_contents(mnt: &Path, src: &Path) {
    for name in regular_files(&listing(src)) {
        assert!(
            fs::read(mnt.join(name)).unwrap() == fs::read(src.join(name)).unwrap(),
            "{name:?} differs"
        );
    }
}

/// `fsverity measure` of every regular file of `mnt` gives what `fsverity
/// digest` gives for its source in `src`.
fn assert_digests(mnt: &Path, src: &Path) {
    for name in regular_files(&listing(src)) {
        assert_eq!(
            measure(&mnt.join(name)),
            digest(&src.join(name), &[]),
            "{name:?}"
        );
    }
}

/// `env` with the S3 endpoint `endpoint`.
fn with_endpoint(env: &[(&'static str, String)], endpoint: &str) -> Vec<(&'static str, String)> {
    env.iter()
        .map(|(k, v)| match *k {
            "AWS_ENDPOINT" => (*k, endpoint.to_owned()),
            _ => (*k, v.clone()),
        })
        .collect()
}

/// `env` with the endpoint `proxy` (in front of moto) instead of moto.
fn through(proxy: &Proxy, env: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    with_endpoint(env, proxy.url().trim_end_matches('/'))
}

#[test]
fn the_mount_serves_the_tree_published_to_the_bucket() {
    let image = S3Image::publish();
    let started = Instant::now();
    let mount = image.mount_with(&image.env(), &[]);
    println!("mounted from moto in {:?}", started.elapsed());
    let source = listing(&image.src);
    assert_eq!(listing(&mount.mnt), source);
    assert_eq!(source.len(), 14, "{source:#?}");
    let started = Instant::now();
    assert_same_contents(&mount.mnt, &image.src);
    println!("read every file from moto in {:?}", started.elapsed());
    assert_digests(&mount.mnt, &image.src);
    let verified = counter(&mount.mnt, "data_blocks_verified");
    assert!(verified >= BIG_SIZE.div_ceil(4096) as u64, "{verified}");
    // The same image as published into a directory.
    image.local_image();
}

#[test]
fn a_second_publish_keeps_the_objects() {
    let image = S3Image::publish();
    let objects = fs::read_dir(image.local_image().join("objects"))
        .unwrap()
        .count() as u64;
    let proxy = Proxy::start(image.moto().addr()).unwrap();
    let started = Instant::now();
    let digest = image.publish_with(&through(&proxy, &image.env()));
    println!("published again in {:?}", started.elapsed());
    assert_eq!(digest, image.digest);
    // One HEAD per object, found with its size, and the manifest's PUT:
    // no object was written again.
    assert_eq!(proxy.requests(), objects + 1);
    let mount = image.mount_with(&image.env(), &[]);
    assert_same_contents(&mount.mnt, &image.src);
}

/// A store whose answer to the start of a multipart upload (the big
/// file's) is a 256 MiB page: `publish` fails at once, without reading it.
#[test]
fn a_huge_answer_to_an_upload_fails_the_publish_unread() {
    let image = S3Image::publish();
    let proxy = Proxy::start(image.moto().addr()).unwrap();
    proxy.set(Faults {
        status: Some(200),
        status_body: 256 << 20,
        only_path_containing: Some("?uploads".into()),
        ..Faults::default()
    });
    let started = Instant::now();
    let out = run(Command::new(VERITYFS)
        .arg("publish")
        .arg(&image.src)
        .arg(format!("s3://{BUCKET}/elsewhere"))
        .envs(through(&proxy, &image.env())));
    let (took, err) = (started.elapsed(), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("larger than 1048576 bytes"), "{err}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    println!("publish failed in {took:?}: {}", err.trim());
}

#[test]
fn a_wrong_digest_is_refused_with_nothing_mounted() {
    let image = S3Image::publish();
    let mnt = image.dir.path().join("mnt");
    let last = image.digest.chars().last().unwrap();
    let flipped = if last == '0' { '1' } else { '0' };
    let wrong = format!("{}{flipped}", &image.digest[..image.digest.len() - 1]);
    let out = image.try_mount(&mnt, &[&format!("--digest={wrong}")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("FILE CORRUPTED!"), "{stderr}");
    assert!(stderr.contains(&image.url), "names the image: {stderr}");
    assert!(stderr.contains("does not match --digest"), "{stderr}");
    assert!(!is_mounted(&mnt));
}

#[test]
fn a_damaged_object_in_the_bucket_fails_its_block_only() {
    let image = S3Image::publish();
    let (key, local) = image.object_of("big");
    let mut object = fs::read(local).unwrap();
    let damaged = BIG_SIZE - 100;
    object[damaged] ^= 1;
    image.moto().put_object(BUCKET, &key, &object).unwrap();

    let mount = image.mount_with(&image.env(), &[]);
    assert_damaged_block_only(&mount, &image.src, damaged as u64);
}

#[test]
fn the_cache_dir_serves_what_it_holds_with_the_server_gone() {
    let mut image = S3Image::publish();
    let proxy = Proxy::start(image.moto().addr()).unwrap();
    let cache = image.dir.path().join("cache");
    let cache_arg = format!("--cache-dir={}", cache.display());
    let mut mount = image.mount_with(&through(&proxy, &image.env()), &[&cache_arg]);
    assert_same_contents(&mount.mnt, &image.src);
    assert_digests(&mount.mnt, &image.src);
    mount.unmount();
    let online = proxy.requests();
    assert!(online > 0);

    image.stop_server();
    let digest = format!("--digest={}", image.digest);
    let started = Instant::now();
    // The daemon's environment is the first mount's.
    mount.start(&prepend(&digest, &[&cache_arg]));
    println!("mounted from the cache in {:?}", started.elapsed());
    assert_eq!(listing(&mount.mnt), listing(&image.src));
    assert_same_contents(&mount.mnt, &image.src);
    assert_digests(&mount.mnt, &image.src);
    assert_eq!(proxy.requests(), online, "nothing was asked of the network");
}

#[test]
fn failed_publishes_name_the_destination_and_leave_nothing_behind() {
    let image = S3Image::publish();
    let try_publish = |dest: &str, env: &[(&str, String)]| {
        let out = run(Command::new(VERITYFS)
            .arg("publish")
            .arg(&image.src)
            .arg(dest)
            .envs(env.iter().map(|(k, v)| (k, v))));
        assert!(out.stdout.is_empty(), "{out:?}");
        assert_no_staging_left(&image.tmp());
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code(), stderr)
    };
    let (status, stderr) = try_publish("https://127.0.0.1:1/image", &image.env());
    assert_eq!(status, Some(2), "{stderr}");
    assert!(
        stderr.contains("a web server is read-only: publish into a directory and serve it"),
        "{stderr}"
    );
    let (status, stderr) = try_publish("s3://missing/prefix", &image.env());
    assert_eq!(status, Some(1), "{stderr}");
    assert!(
        stderr.contains("can't publish to 's3://missing/prefix': the bucket does not exist"),
        "{stderr}"
    );
    // Nothing listens there: the publish fails (without hanging), naming
    // the image and the endpoint.
    let started = Instant::now();
    let unreachable = with_endpoint(&image.env(), "http://127.0.0.1:1");
    let (status, stderr) = try_publish(&image.url, &unreachable);
    assert_eq!(status, Some(1), "{stderr}");
    assert!(
        stderr.contains("can't publish to 's3://bucket/some/prefix': ")
            && stderr.contains("http://127.0.0.1:1/"),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(10), "{stderr}");
    // The image in the bucket is still whole.
    let mount = image.mount_with(&image.env(), &[]);
    assert_same_contents(&mount.mnt, &image.src);
}

/// Makes `NAME.pem` in `dir`: a private key and its self-signed
/// certificate, as `verityfs sign --key` reads them.
fn key_and_cert(dir: &Path, name: &str) -> PathBuf {
    let pem = dir.join(format!("{name}.pem"));
    run_ok(
        Command::new("openssl")
            .args([
                "req", "-x509", "-nodes", "-days", "30", "-newkey", "rsa:2048",
            ])
            .args(["-subj", &format!("/CN={name}"), "-keyout"])
            .arg(&pem)
            .arg("-out")
            .arg(dir.join(format!("{name}.crt"))),
    );
    let cert = fs::read(dir.join(format!("{name}.crt"))).unwrap();
    let mut file = fs::OpenOptions::new().append(true).open(&pem).unwrap();
    std::io::Write::write_all(&mut file, &cert).unwrap();
    pem
}

#[test]
fn a_signed_manifest_is_mounted_by_its_certificate_without_a_digest() {
    let image = S3Image::publish();
    let keys = image.dir.path().join("keys");
    fs::create_dir_all(&keys).unwrap();
    let (publisher, other) = (
        key_and_cert(&keys, "publisher"),
        key_and_cert(&keys, "other"),
    );
    let signed_url = format!("s3://{BUCKET}/signed");
    let signed = run_ok(
        Command::new(VERITYFS)
            .arg("publish")
            .arg(&image.src)
            .arg(&signed_url)
            .arg(format!("--key={}", publisher.display()))
            .envs(image.env()),
    );
    assert_eq!(signed.trim(), image.digest, "signing keeps the digest");
    let trusting = |pem: &Path| format!("--trusted-cert={}", pem.display());
    let mount = Mount::with_env(
        Path::new(&signed_url),
        &image.env(),
        &[&trusting(&publisher)],
    );
    assert_same_contents(&mount.mnt, &image.src);
    drop(mount);
    let mnt = image.dir.path().join("mnt");
    let refused = |url: &str, pem: &Path, message: &str| {
        let out = run(Command::new(VERITYFS)
            .args(["mount", url])
            .arg(&mnt)
            .arg(trusting(pem))
            .envs(image.env()));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(message), "{stderr}");
        assert!(
            stderr.contains("not signed by a --trusted-cert"),
            "{stderr}"
        );
        assert!(!is_mounted(&mnt));
    };
    refused(&signed_url, &other, "signing cert isn't trusted");
    refused(&image.url, &publisher, "no built-in signature");
}
