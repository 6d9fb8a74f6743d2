//! kube-proxy's chain names: SHA-256 (FIPS 180-4) of a name, RFC 4648 base32, truncated.
//!
//! kube-proxy hashes the service port name (and the endpoint) into its chain names so they are
//! unique, bounded in length and visually distinct: `servicePortChainNameBase` /
//! `servicePortEndpointChainNameBase` / `hashAndTruncate` in `pkg/proxy/nftables/proxier.go`
//! and `portProtoHash` / `servicePortEndpointChainName` in `pkg/proxy/iptables/proxier.go`.
//! SHA-256 is implemented here (a few dozen lines) rather than pulled in as a crate; it is
//! pinned by the FIPS 180-4 test vectors below.

/// SHA-256 round constants (FIPS 180-4 §4.2.2).
const K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
    0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
    0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
    0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2,
];

/// SHA-256 digest of `data` (FIPS 180-4 §6.2).
pub fn sha256(data: &[u8]) -> [u8; 32] {
    let mut h: [u32; 8] =
        [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];
    // Padding (§5.1.1): 0x80, zeros, then the bit length as a big-endian u64.
    let mut msg = data.to_vec();
    let bit_len = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bit_len.to_be_bytes());
    for block in msg.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16].wrapping_add(s0).wrapping_add(w[i - 7]).wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh.wrapping_add(s1).wrapping_add(ch).wrapping_add(K[i]).wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, v) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(v);
        }
    }
    let mut out = [0u8; 32];
    for (chunk, v) in out.chunks_exact_mut(4).zip(h) {
        chunk.copy_from_slice(&v.to_be_bytes());
    }
    out
}

/// RFC 4648 §6 base32 with the standard alphabet and `=` padding (Go's
/// `base32.StdEncoding.EncodeToString`).
pub fn base32_std(data: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::with_capacity(data.len().div_ceil(5) * 8);
    for chunk in data.chunks(5) {
        let mut buf = [0u8; 5];
        buf[..chunk.len()].copy_from_slice(chunk);
        let v = buf.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
        let symbols = (chunk.len() * 8).div_ceil(5);
        for i in 0..8 {
            if i < symbols {
                let idx = usize::try_from((v >> (35 - 5 * i)) & 31).unwrap_or(0);
                out.push(char::from(ALPHABET[idx]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Largest length of an nftables object name (knftables `NameLengthMax`, the kernel's
/// `NFT_NAME_MAXLEN`).
pub const NFT_NAME_LENGTH_MAX: usize = 256;
/// Longest chain-name prefix kube-proxy uses, hyphen included (`chainNamePrefixLengthMax`).
pub const NFT_CHAIN_PREFIX_LENGTH_MAX: usize = 16;

/// kube-proxy nftables `hashAndTruncate`: the first 8 base32 characters of the SHA-256 of
/// `name`, a hyphen, then `name`, truncated with `...` to `chainNameBaseLengthMax` (240).
pub fn hash_and_truncate(name: &str) -> String {
    let max = NFT_NAME_LENGTH_MAX - NFT_CHAIN_PREFIX_LENGTH_MAX;
    let encoded = base32_std(&sha256(name.as_bytes()));
    let mut out = format!("{}-{name}", &encoded[..8]);
    if out.len() > max {
        let mut cut = max - 3;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push_str("...");
    }
    out
}

/// kube-proxy nftables `servicePortChainNameBase`: `HASH-namespace/name/protocol/port`.
pub fn nft_service_port_base(namespace: &str, name: &str, protocol: &str, port: &str) -> String {
    hash_and_truncate(&format!("{namespace}/{name}/{protocol}/{port}"))
}

/// kube-proxy nftables `servicePortEndpointChainNameBase`:
/// `HASH-namespace/name/protocol/port__ip/port`, with the colons of an IPv6 address turned
/// into dots (colons are not allowed in chain names).
pub fn nft_endpoint_base(
    namespace: &str,
    name: &str,
    protocol: &str,
    port: &str,
    ep_ip: std::net::IpAddr,
    ep_port: u16,
) -> String {
    let ip = ep_ip.to_string().replace(':', ".");
    hash_and_truncate(&format!("{namespace}/{name}/{protocol}/{port}__{ip}/{ep_port}"))
}

/// kube-proxy iptables `portProtoHash`: the first 16 base32 characters of
/// SHA-256(`servicePortName` + `protocol`).
pub fn iptables_port_proto_hash(service_port_name: &str, protocol: &str) -> String {
    let encoded = base32_std(&sha256(format!("{service_port_name}{protocol}").as_bytes()));
    encoded[..16].to_owned()
}

/// kube-proxy iptables `servicePortEndpointChainName`: `KUBE-SEP-` + the first 16 base32
/// characters of SHA-256(`servicePortName` + `protocol` + `endpoint`), where `endpoint` is
/// `ip:port` (`[ip]:port` for IPv6, Go's `net.JoinHostPort`).
pub fn iptables_sep_chain(service_port_name: &str, protocol: &str, endpoint: &str) -> String {
    let encoded = base32_std(&sha256(format!("{service_port_name}{protocol}{endpoint}").as_bytes()));
    format!("KUBE-SEP-{}", &encoded[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(d: &[u8]) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn sha256_matches_fips_180_4_vectors() {
        assert_eq!(hex(&sha256(b"")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(hex(&sha256(b"abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(
            hex(&sha256(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        // Two-block message of exactly 64 bytes.
        let m = [b'a'; 64];
        assert_eq!(hex(&sha256(&m)), "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
    }

    #[test]
    fn base32_matches_rfc_4648_vectors() {
        for (i, o) in [
            ("", ""),
            ("f", "MY======"),
            ("fo", "MZXQ===="),
            ("foo", "MZXW6==="),
            ("foob", "MZXW6YQ="),
            ("fooba", "MZXW6YTB"),
            ("foobar", "MZXW6YTBOI======"),
        ] {
            assert_eq!(base32_std(i.as_bytes()), o, "{i:?}");
        }
    }

    #[test]
    fn chain_names_have_kube_proxy_shape_and_are_distinct() {
        let a = nft_service_port_base("ns1", "svc1", "tcp", "p80");
        assert_eq!(a.len(), 8 + 1 + "ns1/svc1/tcp/p80".len());
        assert!(a.ends_with("-ns1/svc1/tcp/p80"), "{a}");
        assert!(a[..8].bytes().all(|b| b.is_ascii_uppercase() || (b'2'..=b'7').contains(&b)), "{a}");
        let e1 = nft_endpoint_base("ns1", "svc1", "tcp", "p80", "10.180.0.1".parse().unwrap(), 80);
        let e2 = nft_endpoint_base("ns1", "svc1", "tcp", "p80", "10.180.0.2".parse().unwrap(), 80);
        assert!(e1.ends_with("-ns1/svc1/tcp/p80__10.180.0.1/80"), "{e1}");
        assert_ne!(e1[..8], e2[..8], "hash prefixes tell near-identical names apart");
        let v6 = nft_endpoint_base("ns1", "svc1", "tcp", "p80", "fd00::1".parse().unwrap(), 80);
        assert!(v6.ends_with("__fd00..1/80") && !v6.contains(':'), "{v6}");
        let long = hash_and_truncate(&"x".repeat(400));
        assert_eq!(long.len(), 240);
        assert!(long.ends_with("..."));
        let sep = iptables_sep_chain("ns1/svc1:p80", "tcp", "10.180.0.1:80");
        assert_eq!(sep.len(), "KUBE-SEP-".len() + 16);
        assert_eq!(iptables_port_proto_hash("ns1/svc1:p80", "tcp").len(), 16);
    }
}
