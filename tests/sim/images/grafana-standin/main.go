// A STAND-IN for grafana/grafana, for the simulated Sparks (no Grafana binary can be had
// offline). It answers what the program and its checks ask of Grafana:
//   - `grafana server` (the image's entrypoint): GF_SERVER_HTTP_PORT; /api/health; the admin
//     user created from GF_SECURITY_ADMIN_PASSWORD__FILE only when its database (a file in
//     GF_PATHS_DATA) does not exist yet, as Grafana does; /api/search lists the provisioned
//     dashboards (*.json beside GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH) to the admin only
//     (basic auth: anonymous access is off);
//   - `grafana cli [--homepath DIR] admin reset-admin-password --password-from-stdin`
//     (launch/grafana-admin-password.sh, through docker exec).
//
// It renders nothing: no UI, no queries.
package main

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

const help = `grafana-standin: a STAND-IN for Grafana (twinspark's simulator), not Grafana.

  grafana server
  grafana cli [--homepath DIR] admin reset-admin-password --password-from-stdin

Serves /api/health and /api/search (admin, basic auth); keeps the admin password in
$GF_PATHS_DATA/standin-admin.json, created from GF_SECURITY_ADMIN_PASSWORD__FILE once.
`

type admin struct {
	User           string `json:"user"`
	PasswordSHA256 string `json:"password_sha256"`
}

func env(key, fallback string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return fallback
}

func database() string {
	return filepath.Join(env("GF_PATHS_DATA", "/var/lib/grafana"), "standin-admin.json")
}

func digest(password string) string {
	sum := sha256.Sum256([]byte(password))
	return hex.EncodeToString(sum[:])
}

func save(a admin) error {
	data, _ := json.Marshal(a)
	tmp := database() + ".tmp"
	if err := os.WriteFile(tmp, data, 0o640); err != nil {
		return err
	}
	return os.Rename(tmp, database())
}

func load() (admin, error) {
	var a admin
	data, err := os.ReadFile(database())
	if err == nil {
		err = json.Unmarshal(data, &a)
	}
	return a, err
}

func createAdminOnce() {
	if _, err := os.Stat(database()); err == nil {
		return // as Grafana: the __FILE password applies only to a new database
	}
	password := os.Getenv("GF_SECURITY_ADMIN_PASSWORD")
	if file := os.Getenv("GF_SECURITY_ADMIN_PASSWORD__FILE"); file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			log.Fatalf("grafana-standin: %v", err)
		}
		password = string(data)
	}
	if password == "" {
		password = "admin"
	}
	if err := save(admin{env("GF_SECURITY_ADMIN_USER", "admin"), digest(password)}); err != nil {
		log.Fatalf("grafana-standin: cannot create its database: %v", err)
	}
}

func authorized(r *http.Request) bool {
	user, password, ok := r.BasicAuth()
	a, err := load()
	return ok && err == nil && user == a.User &&
		subtle.ConstantTimeCompare([]byte(digest(password)), []byte(a.PasswordSHA256)) == 1
}

func dashboards() []map[string]string {
	home := os.Getenv("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
	out := []map[string]string{}
	if home == "" {
		return out
	}
	files, _ := filepath.Glob(filepath.Join(filepath.Dir(home), "*.json"))
	sort.Strings(files)
	for _, f := range files {
		var d struct{ UID, Title string }
		if data, err := os.ReadFile(f); err == nil && json.Unmarshal(data, &d) == nil {
			out = append(out, map[string]string{"uid": d.UID, "title": d.Title, "type": "dash-db"})
		}
	}
	return out
}

func server() {
	createAdminOnce()
	reply := func(w http.ResponseWriter, code int, body any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(body)
	}
	http.HandleFunc("/api/health", func(w http.ResponseWriter, _ *http.Request) {
		reply(w, 200, map[string]string{"database": "ok", "version": "0.0.0-standin", "commit": "stand-in"})
	})
	http.HandleFunc("/api/search", func(w http.ResponseWriter, r *http.Request) {
		if !authorized(r) {
			reply(w, 401, map[string]string{"message": "Unauthorized"})
			return
		}
		reply(w, 200, dashboards())
	})
	addr := ":" + env("GF_SERVER_HTTP_PORT", "3000")
	log.Printf("grafana-standin (not Grafana): listening on %s", addr)
	log.Fatal(http.ListenAndServe(addr, nil))
}

func cli(args []string) {
	if len(args) >= 2 && args[0] == "--homepath" {
		args = args[2:]
	} else if len(args) >= 1 && strings.HasPrefix(args[0], "--homepath=") {
		args = args[1:]
	}
	if strings.Join(args, " ") != "admin reset-admin-password --password-from-stdin" {
		fmt.Fprint(os.Stderr, help)
		log.Fatalf("grafana-standin: unsupported cli call %q", args)
	}
	data, err := io.ReadAll(os.Stdin)
	if err != nil || len(data) == 0 {
		log.Fatal("grafana-standin: no password on stdin")
	}
	a, err := load()
	if err != nil {
		a = admin{User: env("GF_SECURITY_ADMIN_USER", "admin")}
	}
	a.PasswordSHA256 = digest(string(data))
	if err := save(a); err != nil {
		log.Fatalf("grafana-standin: %v", err)
	}
	fmt.Println("Admin password changed successfully ✔")
}

func main() {
	args := os.Args[1:]
	for _, arg := range args {
		if arg == "--help" || arg == "-h" { // the entrypoint puts `server` first: `docker run IMAGE --help`
			fmt.Fprint(os.Stderr, help)
			return
		}
	}
	switch {
	case len(args) >= 1 && args[0] == "server":
		server()
	case len(args) >= 1 && args[0] == "cli":
		cli(args[1:])
	default:
		fmt.Fprint(os.Stderr, help)
		if len(args) == 0 || (args[0] != "--help" && args[0] != "-h") {
			os.Exit(2)
		}
	}
}
