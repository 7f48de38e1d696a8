package buildcache

import (
	"context"
	"encoding/hex"
	"io"

	"github.com/rclone/gofakes3"
)

// backend is one cluster's bucket as gofakes3 sees it: the only bucket there is.
type backend struct{ b *bucket }

var (
	_ gofakes3.Backend          = (*backend)(nil)
	_ gofakes3.MultipartBackend = (*backend)(nil)
)

// own says whether name is this backend's bucket, as it must be for anything to exist.
func (be *backend) own(name string) error {
	if name != be.b.bucketName {
		return gofakes3.BucketNotFound(name)
	}
	return nil
}

func (be *backend) ListBuckets(ctx context.Context) ([]gofakes3.BucketInfo, error) {
	if ok, _ := be.BucketExists(ctx, be.b.bucketName); !ok {
		return []gofakes3.BucketInfo{}, nil
	}
	return []gofakes3.BucketInfo{{Name: be.b.bucketName, CreationDate: gofakes3.NewContentTime(be.b.created)}}, nil
}

func (be *backend) ListBucket(ctx context.Context, name string, prefix *gofakes3.Prefix, page gofakes3.ListBucketPage) (*gofakes3.ObjectList, error) {
	if err := be.own(name); err != nil {
		return nil, err
	}
	return be.b.list(prefix, page)
}

func (be *backend) CreateBucket(ctx context.Context, name string) error {
	if name == be.b.bucketName {
		return gofakes3.ResourceError(gofakes3.ErrBucketAlreadyExists, name)
	}
	return gofakes3.ErrorMessage(gofakes3.ErrTooManyBuckets, "A cluster's build cache has one bucket, named after the cluster.")
}

func (be *backend) BucketExists(ctx context.Context, name string) (bool, error) {
	if name != be.b.bucketName {
		return false, nil
	}
	be.b.mu.Lock()
	defer be.b.mu.Unlock()
	return !be.b.closed, nil
}

func (be *backend) DeleteBucket(ctx context.Context, name string) error {
	if err := be.own(name); err != nil {
		return err
	}
	return gofakes3.ErrorMessage(gofakes3.ErrMethodNotAllowed, "The build cache bucket is the host's; it goes with the cluster.")
}

func (be *backend) GetObject(ctx context.Context, bucketName, objectName string, rangeRequest *gofakes3.ObjectRangeRequest) (*gofakes3.Object, error) {
	if err := be.own(bucketName); err != nil {
		return nil, err
	}
	return be.b.get(objectName, rangeRequest, true, true)
}

func (be *backend) HeadObject(ctx context.Context, bucketName, objectName string) (*gofakes3.Object, error) {
	if err := be.own(bucketName); err != nil {
		return nil, err
	}
	return be.b.get(objectName, nil, false, false)
}

func (be *backend) DeleteObject(ctx context.Context, bucketName, objectName string) (gofakes3.ObjectDeleteResult, error) {
	if err := be.own(bucketName); err != nil {
		return gofakes3.ObjectDeleteResult{}, err
	}
	return gofakes3.ObjectDeleteResult{}, be.b.delete(objectName)
}

func (be *backend) PutObject(ctx context.Context, bucketName, key string, meta map[string]string, input io.Reader, size int64) (gofakes3.PutObjectResult, error) {
	if err := be.own(bucketName); err != nil {
		return gofakes3.PutObjectResult{}, err
	}
	if _, err := be.b.put(ctx, key, meta, input, size); err != nil {
		return gofakes3.PutObjectResult{}, err
	}
	return gofakes3.PutObjectResult{}, nil
}

func (be *backend) DeleteMulti(ctx context.Context, bucketName string, objects ...string) (gofakes3.MultiDeleteResult, error) {
	var result gofakes3.MultiDeleteResult
	if err := be.own(bucketName); err != nil {
		return result, err
	}
	for _, key := range objects {
		if err := be.b.delete(key); err != nil {
			res := gofakes3.ErrorResultFromError(err)
			res.Key = key
			result.Error = append(result.Error, res)
			continue
		}
		result.Deleted = append(result.Deleted, gofakes3.ObjectID{Key: key})
	}
	return result, nil
}

func (be *backend) CopyObject(ctx context.Context, srcBucket, srcKey, dstBucket, dstKey string, meta map[string]string) (gofakes3.CopyObjectResult, error) {
	if err := be.own(srcBucket); err != nil {
		return gofakes3.CopyObjectResult{}, err
	}
	if err := be.own(dstBucket); err != nil {
		return gofakes3.CopyObjectResult{}, err
	}
	src, err := be.b.get(srcKey, nil, true, false)
	if err != nil {
		return gofakes3.CopyObjectResult{}, err
	}
	defer src.Contents.Close()
	sum, err := be.b.put(ctx, dstKey, meta, src.Contents, src.Size)
	if err != nil {
		return gofakes3.CopyObjectResult{}, err
	}
	return gofakes3.CopyObjectResult{
		ETag:         `"` + hex.EncodeToString(sum) + `"`,
		LastModified: gofakes3.NewContentTime(be.b.cache.now()),
	}, nil
}

// Multipart uploads are refused at their start, so gofakes3 never begins one of its
// own (in memory, outside the budget) and has no upload for a part to join.
const noMultipart = "Multipart uploads are not supported by the build cache; upload the object with one PUT."

func (be *backend) CreateMultipartUpload(ctx context.Context, bucket, object string, meta map[string]string) (gofakes3.UploadID, error) {
	return "", gofakes3.ErrorMessage(gofakes3.ErrNotImplemented, noMultipart)
}

func (be *backend) UploadPart(ctx context.Context, bucket, object string, id gofakes3.UploadID, partNumber int, contentLength int64, input io.Reader) (string, error) {
	return "", gofakes3.ErrNoSuchUpload
}

func (be *backend) CompleteMultipartUpload(ctx context.Context, bucket, object string, id gofakes3.UploadID, input *gofakes3.CompleteMultipartUploadRequest) (gofakes3.VersionID, string, error) {
	return "", "", gofakes3.ErrNoSuchUpload
}

func (be *backend) AbortMultipartUpload(ctx context.Context, bucket, object string, id gofakes3.UploadID) error {
	return gofakes3.ErrNoSuchUpload
}
