//! Remote URLs (`s3://bucket/prefix`, `file:///path`) and the object store they open.
//!
//! Credentials never come from the URL (one carrying any is refused, and the refusal does not
//! repeat it): for `s3://` they, the endpoint and the region come from the standard AWS
//! environment variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
//! `AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ALLOW_HTTP`), read by `object_store` into the
//! daemon's memory only. A URL is saved in the state dir and shown by `status` as given,
//! which is safe because it holds no secret.
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use object_store::path::Path as StorePath;

/// A parsed remote URL: where, and the prefix every object name is put under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteUrl {
    pub scheme: Scheme,
    /// The URL as the user gave it (no credentials: refused at parse).
    pub text: String,
    /// `s3`: the bucket; `file`: the directory.
    pub location: String,
    /// Object-name prefix inside the bucket (`""`: the bucket's root).
    pub prefix: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    S3,
    File,
}

fn refuse(why: impl std::fmt::Display) -> String {
    format!("invalid remote URL: {why} (expected s3://BUCKET[/PREFIX] or file:///PATH)")
}

impl std::str::FromStr for RemoteUrl {
    type Err = String;

    fn from_str(text: &str) -> Result<RemoteUrl, String> {
        let url = url::Url::parse(text).map_err(refuse)?;
        // Checked before anything else is said about the URL, and never echoed: the error
        // names the parts, not their values.
        if !url.username().is_empty() || url.password().is_some() {
            return Err(refuse(
                "it carries credentials; give them in the AWS environment variables \
                 (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) instead, so that they stay out \
                 of the state dir, logs and status",
            ));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(refuse(
                "it has a query or fragment (credentials or options go in the environment)",
            ));
        }
        let path = url.path().trim_matches('/').to_string();
        match url.scheme() {
            "s3" => {
                let bucket = url.host_str().unwrap_or("").to_string();
                if bucket.is_empty() || url.port().is_some() {
                    return Err(refuse("no bucket name"));
                }
                Ok(RemoteUrl {
                    scheme: Scheme::S3,
                    text: text.to_string(),
                    location: bucket,
                    prefix: path,
                })
            }
            "file" => {
                if url.host_str().is_some_and(|h| !h.is_empty()) {
                    return Err(refuse("a file:// URL names no host: file:///PATH"));
                }
                if path.is_empty() {
                    return Err(refuse("no directory"));
                }
                Ok(RemoteUrl {
                    scheme: Scheme::File,
                    text: text.to_string(),
                    location: format!("/{path}"),
                    prefix: String::new(),
                })
            }
            other => Err(refuse(format!("unknown scheme {other}:"))),
        }
    }
}

impl std::fmt::Display for RemoteUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// How long one request may take, and how often `object_store` retries it, before the
/// push worker counts the attempt as failed and backs off (so a down remote costs a bounded
/// wait of the worker thread, and nothing else).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl RemoteUrl {
    /// Opens the store. For `s3://`, from the AWS environment variables; plain http is
    /// allowed only when `AWS_ALLOW_HTTP=true` says so (a local Garage, MinIO).
    pub fn open(&self) -> Result<Arc<dyn ObjectStore>, String> {
        match self.scheme {
            Scheme::S3 => {
                let client = object_store::ClientOptions::new()
                    .with_timeout(REQUEST_TIMEOUT)
                    .with_connect_timeout(CONNECT_TIMEOUT);
                let retry = object_store::RetryConfig {
                    max_retries: 2,
                    retry_timeout: Duration::from_secs(20),
                    ..Default::default()
                };
                // The bounds first: `with_client_options` replaces every client option, so
                // the environment's (AWS_ALLOW_HTTP, proxies) are applied after it, as
                // `AmazonS3Builder::from_env` reads them.
                let mut builder = object_store::aws::AmazonS3Builder::new()
                    .with_client_options(client)
                    .with_retry(retry);
                for (key, value) in std::env::vars_os() {
                    if let (Some(key), Some(value)) = (key.to_str(), value.to_str())
                        && key.starts_with("AWS_")
                        && let Ok(config) = key.to_ascii_lowercase().parse()
                    {
                        builder = builder.with_config(config, value);
                    }
                }
                let s3 = builder
                    .with_bucket_name(&self.location)
                    .build()
                    .map_err(|e| super::repo::redact(format!("cannot open {}: {e}", self.text)))?;
                Ok(Arc::new(s3))
            }
            Scheme::File => {
                std::fs::create_dir_all(&self.location)
                    .map_err(|e| format!("cannot create {}: {e}", self.location))?;
                let fs = object_store::local::LocalFileSystem::new_with_prefix(&self.location)
                    .map_err(|e| format!("cannot open {}: {e}", self.text))?;
                Ok(Arc::new(fs))
            }
        }
    }

    /// The store path of `name` (relative to the repository root) under the URL's prefix.
    pub fn object_path(&self, name: &str) -> StorePath {
        if self.prefix.is_empty() {
            StorePath::from(name)
        } else {
            StorePath::from(format!("{}/{name}", self.prefix))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_credentials_are_refused_without_being_repeated() {
        let u: RemoteUrl = "s3://bucket/some/prefix".parse().unwrap();
        assert_eq!(
            (u.scheme, &*u.location, &*u.prefix),
            (Scheme::S3, "bucket", "some/prefix")
        );
        let u: RemoteUrl = "s3://bucket".parse().unwrap();
        assert_eq!(u.prefix, "");
        let u: RemoteUrl = "file:///var/tmp/remote".parse().unwrap();
        assert_eq!((u.scheme, &*u.location), (Scheme::File, "/var/tmp/remote"));
        for bad in [
            "s3://AKIDLEAKUSER:LEAKPASSWORD@bucket/p",
            "s3://LEAKPASSWORD@bucket/p",
            "s3://bucket/p?secret=LEAKPASSWORD",
        ] {
            let e = bad.parse::<RemoteUrl>().unwrap_err();
            assert!(!e.contains("LEAK"), "{e}");
        }
        assert!("http://x/y".parse::<RemoteUrl>().is_err());
        assert!("s3:///p".parse::<RemoteUrl>().is_err());
        assert!("file://host/p".parse::<RemoteUrl>().is_err());
    }
}
