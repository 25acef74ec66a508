package remote

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	p "github.com/pulumi/pulumi-go-provider"
	"github.com/pulumi/pulumi-go-provider/infer"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/retry"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

// Connection and ProxyConnection: pulumi-command v1.2.1's fields, secrets and defaults
// (user root, port 22, dialErrorLimit 10, perDialTimeout 15 s).
type Connection struct {
	connectionBase
	Proxy *ProxyConnection `pulumi:"proxy,optional"`
}

type ProxyConnection struct{ connectionBase }

type connectionBase struct {
	User               *string  `pulumi:"user,optional"`
	Password           *string  `pulumi:"password,optional"           provider:"secret"`
	Host               *string  `pulumi:"host"`
	Port               *float64 `pulumi:"port,optional"`
	PrivateKey         *string  `pulumi:"privateKey,optional"         provider:"secret"`
	PrivateKeyPassword *string  `pulumi:"privateKeyPassword,optional" provider:"secret"`
	AgentSocketPath    *string  `pulumi:"agentSocketPath,optional"`
	DialErrorLimit     *int     `pulumi:"dialErrorLimit,optional"`
	PerDialTimeout     *int     `pulumi:"perDialTimeout,optional"`
	HostKey            *string  `pulumi:"hostKey,optional"`
}

func annotateBase(a infer.Annotator, c *connectionBase) {
	a.Describe(&c.User, "The login user.")
	a.SetDefault(&c.User, "root")
	a.Describe(&c.Password, "A password (also answers keyboard-interactive prompts).")
	a.Describe(&c.Host, "The host to connect to.")
	a.Describe(&c.Port, "The port; 22 when unset.")
	a.SetDefault(&c.Port, 22)
	a.Describe(&c.PrivateKey, "The contents of a private key.")
	a.Describe(&c.PrivateKeyPassword, "The passphrase of an encrypted private key.")
	a.Describe(&c.AgentSocketPath, "An ssh-agent socket; SSH_AUTH_SOCK when unset.")
	a.Describe(&c.DialErrorLimit, "Failed dials allowed before giving up; -1 is unlimited. Default 10.")
	a.SetDefault(&c.DialErrorLimit, 10)
	a.Describe(&c.PerDialTimeout, "Seconds each dial may take; 0 is no limit. Default 15.")
	a.SetDefault(&c.PerDialTimeout, 15)
	a.Describe(&c.HostKey, "The host's public key (authorized_keys form); when unset any host key is accepted.")
}

func (c *Connection) Annotate(a infer.Annotator) {
	a.Describe(&c, "How to reach a host over SSH.")
	annotateBase(a, &c.connectionBase)
	a.Describe(&c.Proxy, "A bastion host to connect through.")
}

func (c *ProxyConnection) Annotate(a infer.Annotator) {
	a.Describe(&c, "How to reach the bastion host.")
	annotateBase(a, &c.connectionBase)
}

// clientConfig: a pinned host key accepts only that key (and asks the server for that
// algorithm); auth methods in the real provider's order: key, password (+ keyboard-interactive),
// then the agent (agentSocketPath, else SSH_AUTH_SOCK; a socket that cannot be dialled fails).
func (c *connectionBase) clientConfig() (*ssh.ClientConfig, error) {
	cfg := &ssh.ClientConfig{
		User:            deref(c.User, "root"),
		Timeout:         time.Duration(deref(c.PerDialTimeout, 15)) * time.Second,
		HostKeyCallback: ssh.InsecureIgnoreHostKey(), //nolint:gosec // as the real one: no hostKey, no check
	}
	if c.HostKey != nil {
		key, _, _, _, err := ssh.ParseAuthorizedKey([]byte(*c.HostKey))
		if err != nil {
			return nil, fmt.Errorf("failed to parse host key: %w", err)
		}
		cfg.HostKeyCallback = ssh.FixedHostKey(key)
		cfg.HostKeyAlgorithms = []string{key.Type()}
	}
	if c.PrivateKey != nil {
		var signer ssh.Signer
		var err error
		if c.PrivateKeyPassword != nil {
			signer, err = ssh.ParsePrivateKeyWithPassphrase([]byte(*c.PrivateKey), []byte(*c.PrivateKeyPassword))
		} else {
			signer, err = ssh.ParsePrivateKey([]byte(*c.PrivateKey))
		}
		if err != nil {
			return nil, err
		}
		cfg.Auth = append(cfg.Auth, ssh.PublicKeys(signer))
	}
	if c.Password != nil {
		pw := *c.Password
		cfg.Auth = append(cfg.Auth, ssh.Password(pw),
			ssh.KeyboardInteractive(func(_, _ string, questions []string, _ []bool) ([]string, error) {
				answers := make([]string, len(questions))
				for i := range answers {
					answers[i] = pw
				}
				return answers, nil
			}))
	}
	sock := os.Getenv("SSH_AUTH_SOCK")
	if c.AgentSocketPath != nil {
		sock = *c.AgentSocketPath
	}
	if sock != "" {
		conn, err := net.Dial("unix", sock)
		if err != nil {
			return nil, err
		}
		cfg.Auth = append(cfg.Auth, ssh.PublicKeysCallback(agent.NewClient(conn).Signers))
	}
	return cfg, nil
}

func deref[T any](v *T, def T) T {
	if v == nil {
		return def
	}
	return *v
}

func (c *connectionBase) endpoint() string {
	return net.JoinHostPort(deref(c.Host, ""), strconv.Itoa(int(deref(c.Port, 22))))
}

// withRetries calls dial until it succeeds or `limit` attempts have failed (-1: no limit),
// with the sdk's retry back-off, reporting each failure as a status message as the real one does.
func withRetries[T any](ctx context.Context, what string, limit int, dial func() (T, error)) (T, error) {
	var zero T
	var lastErr error
	ok, v, err := retry.Until(ctx, retry.Acceptor{
		Accept: func(try int, _ time.Duration) (bool, any, error) {
			r, err := dial()
			if err == nil {
				return true, r, nil
			}
			lastErr = err
			if limit > -1 && try+1 > limit {
				return true, nil, fmt.Errorf("after %d failed attempts: %w", try, lastErr)
			}
			max := "inf"
			if limit != -1 {
				max = strconv.Itoa(limit)
			}
			p.GetLogger(ctx).InfoStatusf("%s %d/%s failed: retrying", what, try+1, max)
			return false, nil, nil
		},
	})
	if ok && err == nil {
		return v.(T), nil
	}
	if err == nil {
		err = ctx.Err()
	}
	return zero, err
}

// Dial connects to the host, through the proxy when one is set.
func (c *Connection) Dial(ctx context.Context) (*ssh.Client, error) {
	cfg, err := c.clientConfig()
	if err != nil {
		return nil, err
	}
	limit := deref(c.DialErrorLimit, 10)
	target := c.endpoint()
	if c.Proxy == nil {
		return withRetries(ctx, "Dial", limit, func() (*ssh.Client, error) { return ssh.Dial("tcp", target, cfg) })
	}
	proxyCfg, err := c.Proxy.clientConfig()
	if err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	bastion, err := withRetries(ctx, "Dial proxy", deref(c.Proxy.DialErrorLimit, 10), func() (*ssh.Client, error) {
		return ssh.Dial("tcp", c.Proxy.endpoint(), proxyCfg)
	})
	if err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	tunnel, err := withRetries(ctx, "Dial from proxy", limit, func() (net.Conn, error) { return bastion.Dial("tcp", target) })
	if err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	var chans <-chan ssh.NewChannel
	var reqs <-chan *ssh.Request
	conn, err := withRetries(ctx, "Dial", limit, func() (ssh.Conn, error) {
		conn, ch, rq, err := ssh.NewClientConn(tunnel, target, cfg)
		chans, reqs = ch, rq
		return conn, err
	})
	if err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	return ssh.NewClient(conn, chans, reqs), nil
}
