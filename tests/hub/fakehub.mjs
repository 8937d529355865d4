// fakehub: a stand-in for the Hugging Face Hub on a loopback port, for
// tests/cli/pull.sh. It serves one repository from a folder on disk with the
// Hub's API shapes and headers:
//   GET  /api/models/OWNER/NAME/revision/REV   {"sha", "siblings": [{rfilename, size, blobId, lfs}]}
//   HEAD|GET /OWNER/NAME/resolve/REV/FILE       small files: 200, ETag = git blob id;
//        LFS files (*.safetensors): 302 to /cdn/SHA256 with X-Linked-Etag/X-Linked-Size
//   GET  /cdn/SHA256                             the LFS bytes, with Range support
// Every response carries X-Repo-Commit. Besides the folder's files the
// listing holds files the default set must skip (pytorch_model.bin, an image).
//
// usage: node fakehub.mjs DIR OWNER/NAME STATEDIR
// It listens on 127.0.0.1 on an ephemeral port, writes the port to
// STATEDIR/port, appends one line per request to STATEDIR/log
// ("METHOD URL range=R auth=yes|no"), and reads the fault mode from
// STATEDIR/mode on every request (missing: "ok"):
//   ok, drop (the first LFS GET drops the connection after 1 MiB), dropall
//   (every LFS GET drops after 1 MiB), badsha (the weights have a flipped byte),
//   401, 404, 500 (every request), 500twice (the first two requests fail),
//   dotdot / abs (a listed name "../evil.json" / "/tmp/evil.json"), huge (a
//   declared size of 1e18 bytes), bigdisk (a consistent 512 TiB), endless (an
//   LFS body without end), loop (the LFS redirect points at itself),
//   badjson (a listing that is not JSON), auth (needs "Bearer hf_secret"),
//   nul (a listed name "extra.json\u0000../../evil.json", which a reader that
//   stops at NUL would see as extra.json), silent (accepts every request and
//   never answers it).
import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';
import crypto from 'node:crypto';

const [dir, repo, state] = process.argv.slice(2);
if (!dir || !repo || !state) {
  console.error('usage: node fakehub.mjs DIR OWNER/NAME STATEDIR');
  process.exit(2);
}
const commit = crypto.createHash('sha1').update('commit:' + repo).digest('hex');
const files = new Map();  // name -> {data, lfs, sha256, blobId}
function add(name, data) {
  const lfs = name.endsWith('.safetensors');
  const blobId = crypto.createHash('sha1').update(`blob ${data.length}\0`).update(data).digest('hex');
  files.set(name, { data, lfs, sha256: crypto.createHash('sha256').update(data).digest('hex'), blobId });
}
for (const n of fs.readdirSync(dir).sort()) add(n, fs.readFileSync(path.join(dir, n)));
add('README.md', Buffer.from('# tiny llama\nA test model.\n'));
add('pytorch_model.bin', Buffer.from('not wanted by default\n'));
add('images/logo.png', Buffer.from('\x89PNG not wanted\n'));
const bySha = new Map([...files.values()].filter(f => f.lfs).map(f => [f.sha256, f]));

let served = 0, dropped = false, lastMode = '';
const mode = () => {
  let m = 'ok';
  try { m = fs.readFileSync(path.join(state, 'mode'), 'utf8').trim() || 'ok'; } catch { }
  if (m !== lastMode) { lastMode = m; served = 0; dropped = false; }
  return m;
};

function listing(m) {
  const sib = [...files.entries()].map(([name, f]) => {
    const s = { rfilename: name, size: f.data.length, blobId: f.blobId };
    if (f.lfs) s.lfs = { sha256: f.sha256, size: f.data.length, pointerSize: 134 };
    return s;
  });
  if (m === 'dotdot') sib.push({ rfilename: '../evil.json', size: 2, blobId: '0'.repeat(40) });
  if (m === 'abs') sib.push({ rfilename: '/tmp/evil.json', size: 2, blobId: '0'.repeat(40) });
  if (m === 'nul') sib.push({ rfilename: 'extra.json\0../../evil.json', size: 2, blobId: '0'.repeat(40) });
  for (const s of sib) {
    if (!s.lfs) continue;
    if (m === 'huge') s.size = s.lfs.size = 1e18;
    if (m === 'bigdisk') s.size = s.lfs.size = 2 ** 49;
  }
  return { _id: 'x', id: repo, modelId: repo, private: false, sha: commit, siblings: sib };
}

function send(res, status, headers, body) {
  res.writeHead(status, { 'X-Repo-Commit': commit, ...headers });
  res.end(body);
}

function sendBytes(req, res, data, headers, m) {
  let start = 0;
  const r = /^bytes=(\d+)-$/.exec(req.headers.range || '');
  if (r) {
    start = Number(r[1]);
    if (start >= data.length) return send(res, 416, { 'Content-Range': `bytes */${data.length}` }, '');
  }
  const body = data.subarray(start);
  const h = { ...headers, 'Accept-Ranges': 'bytes', 'Content-Length': String(body.length),
              'Content-Type': 'application/octet-stream' };
  if (r) h['Content-Range'] = `bytes ${start}-${data.length - 1}/${data.length}`;
  res.writeHead(r ? 206 : 200, { 'X-Repo-Commit': commit, ...h });
  if (req.method === 'HEAD') return res.end();
  const cut = (m === 'drop' && !dropped) || m === 'dropall';
  if (cut && body.length > 1 << 20) {
    dropped = true;
    res.write(body.subarray(0, 1 << 20), () => setTimeout(() => req.socket.destroy(), 20));
    return;
  }
  res.end(body);
}

const server = http.createServer((req, res) => {
  const m = mode();
  const auth = req.headers.authorization || '';
  fs.appendFileSync(path.join(state, 'log'),
    `${req.method} ${req.url} range=${req.headers.range || '-'} auth=${auth ? 'yes' : 'no'}\n`);
  served++;
  if (m === 'silent') return;
  if (m === '401') return send(res, 401, { 'X-Error-Message': 'Invalid credentials in Authorization header' }, '');
  if (m === 'auth' && auth !== 'Bearer hf_secret' && !req.url.startsWith('/cdn/'))
    return send(res, 401, { 'X-Error-Code': 'GatedRepo', 'X-Error-Message': 'Access to this model is restricted' }, '');
  if (m === '404') return send(res, 404, { 'X-Error-Code': 'RepoNotFound', 'X-Error-Message': 'Repository not found' }, '');
  if (m === '500' || (m === '500twice' && served <= 2)) return send(res, 500, {}, 'Internal Error');
  const url = new URL(req.url, 'http://x');
  const api = `/api/models/${repo}/revision/`;
  if (url.pathname.startsWith(api)) {
    const rev = decodeURIComponent(url.pathname.slice(api.length));
    if (rev !== 'main' && rev !== commit)
      return send(res, 404, { 'X-Error-Code': 'RevisionNotFound', 'X-Error-Message': `Invalid rev id: ${rev}` }, '');
    if (m === 'badjson') return send(res, 200, { 'Content-Type': 'application/json' }, '{"sha": "abc", ');
    return send(res, 200, { 'Content-Type': 'application/json' }, JSON.stringify(listing(m)));
  }
  const pre = `/${repo}/resolve/`;
  if (url.pathname.startsWith(pre)) {
    const rest = url.pathname.slice(pre.length);
    const slash = rest.indexOf('/');
    const rev = rest.slice(0, slash), name = decodeURIComponent(rest.slice(slash + 1));
    const f = files.get(name);
    if (rev !== commit && rev !== 'main')
      return send(res, 404, { 'X-Error-Code': 'RevisionNotFound' }, '');
    if (!f) return send(res, 404, { 'X-Error-Code': 'EntryNotFound' }, '');
    if (!f.lfs) return sendBytes(req, res, f.data, { ETag: `"${f.blobId}"` }, m);
    let size = f.data.length;
    if (m === 'bigdisk') size = 2 ** 49;
    const loc = m === 'loop' ? url.pathname : `http://127.0.0.1:${server.address().port}/cdn/${f.sha256}`;
    return send(res, 302, { Location: loc, ETag: `"${f.blobId}"`, 'X-Linked-Etag': `"${f.sha256}"`,
                            'X-Linked-Size': String(size) }, '');
  }
  if (url.pathname.startsWith('/cdn/')) {
    const f = bySha.get(url.pathname.slice(5));
    if (!f) return send(res, 404, {}, '');
    if (m === 'endless') {
      res.writeHead(200, { 'Content-Type': 'application/octet-stream' });
      const chunk = Buffer.alloc(1 << 16, 7);
      const pump = () => { while (res.write(chunk)) { } };
      res.on('drain', pump);
      res.on('close', () => res.removeAllListeners('drain'));
      return pump();
    }
    let data = f.data;
    if (m === 'badsha') { data = Buffer.from(data); data[data.length >> 1] ^= 0xff; }
    return sendBytes(req, res, data, { ETag: `"${f.sha256}"` }, m);
  }
  send(res, 404, {}, '');
});
server.listen(0, '127.0.0.1', () => {
  fs.writeFileSync(path.join(state, 'port.tmp'), String(server.address().port));
  fs.renameSync(path.join(state, 'port.tmp'), path.join(state, 'port'));
});
process.on('SIGTERM', () => process.exit(0));
