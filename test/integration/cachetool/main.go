// Command cachetool does in a job Pod what GitLab Runner's helper does with a cache
// archive, for the live build cache test: it uploads a file to a presigned URL (one PUT,
// as the helper's cache-archiver does) or downloads one into a file (the
// cache-extractor), and prints the file's SHA-256 and size.
//
//	cachetool put URL FILE
//	cachetool get URL FILE
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	if len(os.Args) != 4 || (os.Args[1] != "put" && os.Args[1] != "get") {
		fmt.Fprintln(os.Stderr, "usage: cachetool put|get URL FILE")
		os.Exit(2)
	}
	var err error
	if os.Args[1] == "put" {
		err = put(os.Args[2], os.Args[3])
	} else {
		err = get(os.Args[2], os.Args[3])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cachetool:", err)
		os.Exit(1)
	}
	sum, n, err := digest(os.Args[3])
	if err != nil {
		fmt.Fprintln(os.Stderr, "cachetool:", err)
		os.Exit(1)
	}
	fmt.Printf("%s sha256 %s bytes %d\n", os.Args[1], sum, n)
}

var client = &http.Client{Timeout: 5 * time.Minute}

func put(url, file string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	req, err := http.NewRequest(http.MethodPut, url, f)
	if err != nil {
		return err
	}
	req.ContentLength = st.Size()
	req.Header.Set("Content-Type", "application/octet-stream")
	return do(req, nil)
}

func get(url, file string) error {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	return do(req, f)
}

// do sends req and copies a 200's body to w; any other status is an error with the body.
func do(req *http.Request, w io.Writer) error {
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%s: %s: %s", req.Method, resp.Status, b)
	}
	if w == nil {
		return nil
	}
	_, err = io.Copy(w, resp.Body)
	return err
}

func digest(file string) (string, int64, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	return hex.EncodeToString(h.Sum(nil)), n, err
}
