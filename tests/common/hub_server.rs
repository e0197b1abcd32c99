//! A local stand-in for the Hugging Face Hub, for the tests of models and datasets by name:
//! it answers the endpoints ppl's client uses with the hub's headers — repository info,
//! `resolve` with `X-Repo-Commit`, `X-Linked-Etag`/`ETag`, `X-Linked-Size`, a redirect to
//! the LFS bytes, range requests, `X-Error-Code` on 401/404 — and logs every request, so a
//! test can count downloads. It can cut a file's transfer half-way, a set number of times.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use sha1::Digest as _;

/// A repository the server holds.
#[derive(Clone)]
pub struct Repo {
    /// `models` or `datasets`.
    pub kind: &'static str,
    pub id: String,
    pub commit: String,
    /// Other revisions (branches, tags) that resolve to `commit`.
    pub refs: Vec<String>,
    pub files: Vec<(String, Arc<Vec<u8>>)>,
    /// Requests need `Authorization: Bearer {token}`.
    pub token: Option<String>,
}

impl Repo {
    pub fn new(kind: &'static str, id: &str, files: Vec<(String, Vec<u8>)>) -> Self {
        let commit = ppl::sha256::of_bytes(id.as_bytes())[..40].to_string();
        Self {
            kind,
            id: id.to_string(),
            commit,
            refs: vec!["main".into()],
            files: files.into_iter().map(|(n, b)| (n, Arc::new(b))).collect(),
            token: None,
        }
    }
}

#[derive(Default)]
struct State {
    repos: Vec<Repo>,
    log: Vec<String>,
    /// Transfers of these LFS hashes still to cut half-way.
    cuts: HashMap<String, usize>,
}

pub struct HubServer {
    pub endpoint: String,
    state: Arc<Mutex<State>>,
}

/// Files stored in LFS on the real hub (redirected to their bytes, hashed with SHA-256).
fn is_lfs(name: &str) -> bool {
    [".gguf", ".safetensors", ".parquet", ".gz"]
        .iter()
        .any(|e| name.ends_with(e))
}

pub fn git_blob_sha1(bytes: &[u8]) -> String {
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", bytes.len()).as_bytes());
    h.update(bytes);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Arc<Vec<u8>>,
    range: Option<(usize, usize)>,
    /// Close the connection after this many body bytes.
    cut_at: Option<usize>,
}

impl Answer {
    fn status(status: u16, code: &str) -> Self {
        let mut headers = vec![];
        if !code.is_empty() {
            headers.push(("X-Error-Code".into(), code.into()));
        }
        Self {
            status,
            headers,
            body: Arc::new(format!("{{\"error\":\"{code}\"}}").into_bytes()),
            range: None,
            cut_at: None,
        }
    }
}

impl HubServer {
    pub fn start(repos: Vec<Repo>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State {
            repos,
            ..Default::default()
        }));
        let (s, e) = (state.clone(), endpoint.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (s, e) = (s.clone(), e.clone());
                std::thread::spawn(move || {
                    let _ = serve(stream, &s, &e);
                });
            }
        });
        Self { endpoint, state }
    }

    /// The requests so far, as `METHOD path[ range]`.
    pub fn log(&self) -> Vec<String> {
        self.state.lock().unwrap().log.clone()
    }

    pub fn clear_log(&self) {
        self.state.lock().unwrap().log.clear();
    }

    /// Cut the next `times` transfers of `file` (its LFS bytes) half-way.
    pub fn cut(&self, bytes: &[u8], times: usize) {
        let sha = ppl::sha256::of_bytes(bytes);
        self.state.lock().unwrap().cuts.insert(sha, times);
    }

    /// How many GETs fetched the bytes of this content.
    pub fn downloads_of(&self, bytes: &[u8]) -> usize {
        let sha = ppl::sha256::of_bytes(bytes);
        self.log()
            .iter()
            .filter(|l| l.starts_with("GET /lfs/") && l.contains(&sha))
            .count()
    }
}

fn serve(stream: TcpStream, state: &Mutex<State>, endpoint: &str) -> std::io::Result<()> {
    stream.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, target) = (
        parts.next().unwrap_or("").to_string(),
        parts.next().unwrap_or("").to_string(),
    );
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let range = headers.get("range").cloned();
    let auth = headers.get("authorization").cloned();
    let mut entry = format!("{method} {target}");
    if let Some(r) = &range {
        entry.push_str(&format!(" {r}"));
    }
    state.lock().unwrap().log.push(entry);
    let answer = route(
        &method,
        &target,
        range.as_deref(),
        auth.as_deref(),
        state,
        endpoint,
    );
    write_answer(stream, &method, answer)
}

fn route(
    method: &str,
    target: &str,
    range: Option<&str>,
    auth: Option<&str>,
    state: &Mutex<State>,
    endpoint: &str,
) -> Answer {
    let mut st = state.lock().unwrap();
    if let Some(sha) = target.strip_prefix("/lfs/") {
        let body = st
            .repos
            .iter()
            .flat_map(|r| r.files.iter())
            .find(|(_, b)| ppl::sha256::of_bytes(b) == sha)
            .map(|(_, b)| b.clone());
        let Some(body) = body else {
            return Answer::status(404, "");
        };
        let from = range
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.trim_end_matches('-').parse::<usize>().ok());
        let cut_at = match st.cuts.get_mut(sha) {
            Some(n) if *n > 0 => {
                *n -= 1;
                Some((body.len() - from.unwrap_or(0)) / 2)
            }
            _ => None,
        };
        let len = body.len();
        return Answer {
            status: if from.is_some() { 206 } else { 200 },
            headers: vec![],
            range: from.map(|f| (f, len)),
            body,
            cut_at,
        };
    }
    let path = target.split('?').next().unwrap_or("");
    let (kind, rest, api) = if let Some(r) = path.strip_prefix("/api/models/") {
        ("models", r, true)
    } else if let Some(r) = path.strip_prefix("/api/datasets/") {
        ("datasets", r, true)
    } else if let Some(r) = path.strip_prefix("/datasets/") {
        ("datasets", r, false)
    } else {
        ("models", path.trim_start_matches('/'), false)
    };
    let seps: Vec<&str> = rest.splitn(4, '/').collect();
    if seps.len() < 4 {
        return Answer::status(404, "");
    }
    let id = format!("{}/{}", seps[0], seps[1]);
    let (verb, tail) = (seps[2], seps[3]);
    let Some(repo) = st
        .repos
        .iter()
        .find(|r| r.kind == kind && r.id == id)
        .cloned()
    else {
        return Answer::status(401, "RepoNotFound");
    };
    if let Some(t) = &repo.token {
        if auth != Some(format!("Bearer {t}").as_str()) {
            return Answer::status(401, "GatedRepo");
        }
    }
    let (rev, file) = match tail.split_once('/') {
        Some((r, f)) => (decode(r), decode(f)),
        None => (decode(tail), String::new()),
    };
    if rev != repo.commit && !repo.refs.contains(&rev) {
        return Answer::status(404, "RevisionNotFound");
    }
    match (api, verb) {
        (true, "revision") => {
            let siblings: Vec<serde_json::Value> = repo
                .files
                .iter()
                .map(|(n, _)| serde_json::json!({ "rfilename": n }))
                .collect();
            let body =
                serde_json::json!({ "id": repo.id, "sha": repo.commit, "siblings": siblings });
            Answer {
                status: 200,
                headers: vec![("Content-Type".into(), "application/json".into())],
                body: Arc::new(body.to_string().into_bytes()),
                range: None,
                cut_at: None,
            }
        }
        (false, "resolve") => {
            let Some((name, bytes)) = repo.files.iter().find(|(n, _)| *n == file) else {
                return Answer::status(404, "EntryNotFound");
            };
            let mut headers = vec![("X-Repo-Commit".to_string(), repo.commit.clone())];
            if is_lfs(name) {
                let sha = ppl::sha256::of_bytes(bytes);
                headers.push(("X-Linked-Etag".into(), format!("\"{sha}\"")));
                headers.push(("X-Linked-Size".into(), bytes.len().to_string()));
                headers.push(("ETag".into(), "\"lfs-pointer\"".into()));
                headers.push(("Location".into(), format!("{endpoint}/lfs/{sha}")));
                let _ = method;
                Answer {
                    status: 302,
                    headers,
                    body: Arc::new(Vec::new()),
                    range: None,
                    cut_at: None,
                }
            } else {
                headers.push(("ETag".into(), format!("\"{}\"", git_blob_sha1(bytes))));
                Answer {
                    status: 200,
                    headers,
                    body: bytes.clone(),
                    range: None,
                    cut_at: None,
                }
            }
        }
        _ => Answer::status(404, ""),
    }
}

fn write_answer(mut stream: TcpStream, method: &str, a: Answer) -> std::io::Result<()> {
    let (start, end) = a.range.unwrap_or((0, a.body.len()));
    let start = start.min(end);
    let reason = match a.status {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        401 => "Unauthorized",
        _ => "Not Found",
    };
    let mut head = format!("HTTP/1.1 {} {reason}\r\n", a.status);
    for (k, v) in &a.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if a.range.is_some() {
        head.push_str(&format!(
            "Content-Range: bytes {start}-{}/{}\r\n",
            end.saturating_sub(1),
            a.body.len()
        ));
    }
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        end - start
    ));
    stream.write_all(head.as_bytes())?;
    if method != "HEAD" {
        let body = &a.body[start..end];
        let n = a.cut_at.map_or(body.len(), |c| c.min(body.len()));
        stream.write_all(&body[..n])?;
    }
    stream.flush()?;
    let _ = stream.shutdown(std::net::Shutdown::Both);
    Ok(())
}
